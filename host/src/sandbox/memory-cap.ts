// The memory cap of a sandbox is part of the module itself: every linear memory a module
// defines gets a declared maximum of at most the cap. `memory.grow` beyond it then fails
// inside the guest (which usually traps or reports out-of-memory) instead of growing the
// host process. This works the same for Extism plugins and for each core module of a
// component, and costs nothing per call. Imported memories are left alone: the module that
// defines them is capped, and a capped definition still satisfies any import's declared range.

const PAGE = 65536;
const MEMORY_SECTION = 5;

export class MemoryCapError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'MemoryCapError';
  }
}

export function capMemory(bytes: Uint8Array, capBytes: number): Uint8Array<ArrayBuffer> {
  const capPages = Math.floor(capBytes / PAGE);
  // Only the memory section changes: everything else is spliced in as byte slices, so a
  // 1.3 MB module costs one copy, not a walk through JS arrays.
  const parts: Uint8Array[] = [bytes.subarray(0, 8)];
  let offset = 8;
  while (offset < bytes.length) {
    const id = bytes[offset]!;
    const [size, sizeLength] = readLeb(bytes, offset + 1);
    const start = offset + 1 + sizeLength;
    const end = start + size;
    if (end > bytes.length) throw new MemoryCapError('truncated section in module');
    if (id === MEMORY_SECTION) {
      const payload = rewriteMemories(bytes.subarray(start, end), capPages);
      parts.push(Uint8Array.from([id, ...writeLeb(payload.length), ...payload]));
    } else {
      parts.push(bytes.subarray(offset, end));
    }
    offset = end;
  }
  const result = new Uint8Array(parts.reduce((n, part) => n + part.length, 0));
  let at = 0;
  for (const part of parts) {
    result.set(part, at);
    at += part.length;
  }
  return result;
}

function rewriteMemories(section: Uint8Array, capPages: number): number[] {
  const [count, countLength] = readLeb(section, 0);
  const out = writeLeb(count);
  let at = countLength;
  for (let i = 0; i < count; i++) {
    const flags = section[at++]!;
    if (flags > 0x07) throw new MemoryCapError(`unknown memory limits flags 0x${flags.toString(16)}`);
    const [min, minLength] = readLeb(section, at);
    at += minLength;
    let max = Infinity;
    if (flags & 0x01) {
      const [declared, maxLength] = readLeb(section, at);
      at += maxLength;
      max = declared;
    }
    if (min > capPages) {
      throw new MemoryCapError(`its initial memory (${mib(min)} MiB) is already above the ${mib(capPages)} MiB memory cap; raise limits.memoryMiB`);
    }
    out.push(flags | 0x01, ...writeLeb(min), ...writeLeb(Math.min(max, capPages)));
  }
  return out;
}

function mib(pages: number): string {
  return String(Math.round((pages * PAGE) / 2 ** 20 * 10) / 10);
}

function readLeb(bytes: Uint8Array, offset: number): [number, number] {
  let result = 0;
  let shift = 0;
  let length = 0;
  for (;;) {
    const byte = bytes[offset + length];
    if (byte === undefined) throw new MemoryCapError('truncated LEB128 in module');
    result += (byte & 0x7f) * 2 ** shift;
    length++;
    if ((byte & 0x80) === 0) return [result, length];
    shift += 7;
    if (shift > 63) throw new MemoryCapError('LEB128 too long in module');
  }
}

function writeLeb(value: number): number[] {
  const out: number[] = [];
  do {
    let byte = value % 128;
    value = Math.floor(value / 128);
    if (value > 0) byte |= 0x80;
    out.push(byte);
  } while (value > 0);
  return out;
}
