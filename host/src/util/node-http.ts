// node:http, loaded as CommonJS. An ES import of it builds a namespace of all its exports, and
// reading them runs its lazy WebSocket getters, which load the undici bundled in Node: ~55 ms of
// every start on the main thread (cold-start profile), for a client the host never uses.
import type * as NodeHttp from 'node:http';
import { createRequire } from 'node:module';

export const nodeHttp = createRequire(import.meta.url)('node:http') as typeof NodeHttp;
