// Extism imports node:wasi at load even though policies never get WASI (useWasi: false), and
// Node prints an ExperimentalWarning for it in every sandbox worker. Drop only that warning.
const emitWarning = process.emitWarning.bind(process);
process.emitWarning = ((warning: string | Error, ...rest: unknown[]) => {
  if (String(warning).includes('WASI is an experimental feature')) return;
  (emitWarning as (w: string | Error, ...r: unknown[]) => void)(warning, ...rest);
});
