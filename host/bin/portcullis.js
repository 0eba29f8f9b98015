#!/usr/bin/env node
// Node 24 runs the host's TypeScript sources directly (type stripping); no build step.
import '../src/cli/main.ts';
