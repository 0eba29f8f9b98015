// jco writes the names its core modules import and export into the JavaScript glue it generates
// for a component, inside quotes, as they are (jco 1.35: `exports0['${name}']`, `'${module}':
// { '${field}': ... }`). A name with a quote in it is code, which every sandbox worker that loads
// the policy runs with the host's own permissions (red team: a core export named
// `validate']; process.getBuiltinModule('child_process').execSync(...); void exports0['validate`
// ran a shell command at load, and the policy still answered). The names toolchains emit are
// plain ASCII (`wasi:io/streams@0.2|[method]output-stream.write`, `cabi_realloc`, `$imports`):
// anything that could end a string, a comment or a template, or is not printable ASCII, is refused.
// `__proto__` is refused too: jco writes import names as keys of object literals, where that one
// sets the object's prototype instead of adding a key (review: a namespace so named reached the
// core module without the host's guard, as jco's bound trampoline, which V8 then compiled a
// shared import wrapper for; see import-wrappers.ts).
const UNSAFE = /[^\x20-\x7e]|['"`\\]|\$\{|\*\/|^__proto__$/;

/** The first import or export name of `module` that could be more than a name in jco's glue, if any. */
export function unsafeGlueName(module: WebAssembly.Module): string | undefined {
  for (const { module: namespace, name } of WebAssembly.Module.imports(module)) {
    if (UNSAFE.test(namespace)) return namespace;
    if (UNSAFE.test(name)) return name;
  }
  return WebAssembly.Module.exports(module).find(({ name }) => UNSAFE.test(name))?.name;
}
