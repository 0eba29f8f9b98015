// Runs jco's transpile for transpile.ts, in a process of its own: the component's bytes come on
// stdin; file descriptor 3 (not stdout, which a library may write to) gets one JSON line (the
// imports and each file's name and length, or an error) followed by the files' bytes in order.
// The TypeScript declarations come too: they are how the host reads the types of the
// component's imports and exports (prepare.ts checkContract).
import { createWriteStream } from 'node:fs';
import { transpile } from '@bytecodealliance/jco';

const chunks: Buffer[] = [];
for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
let header: string;
let files: Uint8Array[] = [];
try {
  const out = await transpile(Buffer.concat(chunks), { name: 'policy', instantiation: 'async', noTypescript: false, nodejsCompat: false });
  const entries = Object.entries(out.files);
  files = entries.map(([, content]) => content);
  header = JSON.stringify({ imports: out.imports, files: entries.map(([name, content]) => [name, content.length]) });
} catch (error) {
  header = JSON.stringify({ error: error instanceof Error ? error.message : String(error) });
}
const answer = createWriteStream('', { fd: 3 });
answer.write(`${header}\n`);
for (const file of files) answer.write(file);
await new Promise<void>((resolve, reject) => answer.end((error?: Error | null) => (error ? reject(error) : resolve())));
