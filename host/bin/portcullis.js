#!/usr/bin/env node
// The version check runs before any of the CLI is loaded, so an old Node gets one clear line
// instead of a syntax or loader error from deep inside.
import { existsSync } from 'node:fs';

const major = Number(process.versions.node.split('.')[0]);
if (major < 22) {
  process.stderr.write(`portcullis: Node ${process.versions.node} is not supported; install Node 22 or 24 (LTS) and run it again\n`);
  process.exit(1);
}
// In the checkout Node 24 runs the TypeScript sources (type stripping); the installed package
// carries them compiled to JavaScript instead.
const source = new URL('../src/cli/main.ts', import.meta.url);
await import(existsSync(source) ? source.href : new URL('../src/cli/main.js', import.meta.url).href);
