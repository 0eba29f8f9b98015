// A policy is either a Wasm component (TypeScript policies, run through jco) or a core module
// (AssemblyScript policies, run through Extism). The binary header says which: both start with
// "\0asm"; a core module's next four bytes are version 1, a component's are version 0x0d with
// layer 1. File names say nothing reliable.

export type ModuleKind = 'component' | 'core';

export function moduleKind(bytes: Uint8Array): ModuleKind | undefined {
  if (bytes.length < 8 || bytes[0] !== 0x00 || bytes[1] !== 0x61 || bytes[2] !== 0x73 || bytes[3] !== 0x6d) return undefined;
  const version = bytes[4]! | (bytes[5]! << 8);
  const layer = bytes[6]! | (bytes[7]! << 8);
  if (version === 1 && layer === 0) return 'core';
  if (layer === 1) return 'component';
  return undefined;
}
