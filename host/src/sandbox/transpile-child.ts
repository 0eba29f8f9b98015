// Runs jco's transpile for transpile.ts, in a process of its own: the component's bytes come on
// stdin; stdout gets one JSON line (the imports and each file's name and length, or an error)
// followed by the files' bytes, one after the other.
import { transpile } from '@bytecodealliance/jco';

const chunks: Buffer[] = [];
for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
let header: string;
let files: Uint8Array[] = [];
try {
  const out = await transpile(Buffer.concat(chunks), { name: 'policy', instantiation: 'async', noTypescript: true, nodejsCompat: false });
  const entries = Object.entries(out.files);
  files = entries.map(([, content]) => content);
  header = JSON.stringify({ imports: out.imports, files: entries.map(([name, content]) => [name, content.length]) });
} catch (error) {
  header = JSON.stringify({ error: error instanceof Error ? error.message : String(error) });
}
process.stdout.write(`${header}\n`);
for (const file of files) process.stdout.write(file);
