// The host functions a core module (an Extism plugin) may import, and the signature of each.
// Extism's kernel and our own functions are JavaScript, and V8 links a JavaScript function to
// an import of any signature: a module that declared alloc as (i32) -> (i32), or an import with
// no result, loaded fine and failed on every call with "Cannot convert a BigInt value to a
// number" or "returned output that is not JSON ()" (red team). Read here from the module's own
// type and import sections, so the load is refused with the import, what it declared and what
// the host gives.
import { MemoryCapError, readLeb } from './memory-cap.ts';
import { foreignText } from '../util/text.ts';

type Value = 'i32' | 'i64' | 'f32' | 'f64' | 'v128' | 'funcref' | 'externref' | 'ref';
/** A parameter the host reads with u32(): the SDK declares offsets usize (i32), other PDKs i64. */
type Param = Value | 'i32|i64';

interface Signature {
  params: Param[];
  results: Param[];
}

const sig = (params: Param[], results: Param[] = []): Signature => ({ params, results });
const LOG = sig(['i64']);

/** Extism's kernel, as its runtimes and PDKs declare it. Left out on purpose: http_request and friends (network). */
const ENV: ReadonlyMap<string, Signature> = new Map([
  ['alloc', sig(['i64'], ['i64'])], ['free', sig(['i64'])],
  ['length', sig(['i64'], ['i64'])], ['length_unsafe', sig(['i64'], ['i64'])],
  ['load_u8', sig(['i64'], ['i32'])], ['load_u64', sig(['i64'], ['i64'])],
  ['store_u8', sig(['i64', 'i32'])], ['store_u64', sig(['i64', 'i64'])],
  ['input_length', sig([], ['i64'])], ['input_load_u8', sig(['i64'], ['i32'])],
  ['input_load_u64', sig(['i64'], ['i64'])], ['input_offset', sig([], ['i64'])],
  ['output_set', sig(['i64', 'i64'])], ['error_set', sig(['i64'])],
  ['config_get', sig(['i64'], ['i64'])], ['var_get', sig(['i64'], ['i64'])], ['var_set', sig(['i64', 'i64'])],
  ['log_info', LOG], ['log_warn', LOG], ['log_debug', LOG], ['log_error', LOG], ['log_trace', LOG],
  ['get_log_level', sig([], ['i32'])],
]);

/** Ours (guest.ts): context reads (issue 15) and the input in one copy (issue 14). */
const USER: ReadonlyMap<string, Signature> = new Map([
  ['portcullis_context_read', sig(['i64'], ['i64'])], // from SDKs before the call-then-answer pair below; still served
  ['portcullis_context_call', sig(['i32|i64', 'i32|i64'], ['i32'])],
  ['portcullis_context_answer', sig(['i32|i64'])],
  ['portcullis_input_length', sig([], ['i32'])],
  ['portcullis_input_read', sig(['i32|i64'])],
]);

export const KERNEL_NAMESPACES: ReadonlyMap<string, ReadonlyMap<string, Signature>> = new Map([
  ['extism:host/env', ENV], ['extism:host/user', USER],
]);

const VALUE_NAMES = new Map<number, Value>([[0x7f, 'i32'], [0x7e, 'i64'], [0x7d, 'f32'], [0x7c, 'f64'], [0x7b, 'v128'], [0x70, 'funcref'], [0x6f, 'externref']]);
const IMPORT_KINDS = ['function', 'table', 'memory', 'global', 'tag'];
/** As V8 reads a name: a leading byte-order mark is part of it (review: "\ufeffalloc" read as alloc). */
const NAME_DECODER = new TextDecoder('utf-8', { ignoreBOM: true });

/**
 * Why the module's imports cannot be linked by the host, or undefined. `bytes` is the module
 * readLayout has checked (its type section holds only function types); the sections' spans are
 * readLayout's.
 */
export function kernelImportProblem(
  bytes: Uint8Array, sections: { typeSection?: { start: number; end: number }; importSection?: { start: number; end: number } },
): string | undefined {
  if (!sections.importSection) return undefined;
  const types = sections.typeSection ? readTypes(bytes, sections.typeSection.start, sections.typeSection.end) : [];
  const { start, end } = sections.importSection;
  const [count, countLength] = readLeb(bytes, start, end);
  let at = start + countLength;
  const name = (): string => {
    const [length, lengthBytes] = readLeb(bytes, at, end);
    if (at + lengthBytes + length > end) throw new ImportsUnread();
    const text = NAME_DECODER.decode(bytes.subarray(at + lengthBytes, at + lengthBytes + length));
    at += lengthBytes + length;
    return text;
  };
  const leb = (): number => {
    const [value, length] = readLeb(bytes, at, end);
    at += length;
    return value;
  };
  const byte = (): number => {
    if (at >= end) throw new ImportsUnread();
    return bytes[at++]!;
  };
  let i = 0;
  try {
    for (; i < count && at < end; i++) {
      const namespace = name();
      const field = foreignText(name());
      const kind = byte();
      const granted = KERNEL_NAMESPACES.get(namespace);
      if (granted && kind !== 0x00) {
        // One taken as a global, memory or table failed only when instantiated, in V8's words ("global import must be a number...").
        return `it imports ${namespace}.${field} as a ${IMPORT_KINDS[kind] ?? `kind 0x${kind.toString(16)}`}; everything the host gives in ${namespace} is a function ` +
          '(check the import\'s declaration)';
      }
      if (kind === 0x00) {
        const index = leb();
        const wanted = granted?.get(field);
        if (!granted) continue;
        if (!wanted) {
          return `it imports ${namespace}.${field}, which Portcullis does not grant to policies (no files, network, clock, random or environment); build it without that import`;
        }
        const declared = types[index];
        if (!declared || !matches(declared, wanted)) {
          return `it imports ${namespace}.${field} as ${declared ? show(declared) : `type ${index}, which the module does not declare`}, ` +
            `but the host gives it as ${show(wanted)}; declare the import with that signature (or rebuild with the SDK or a current Extism PDK)`;
        }
      } else if (kind === 0x01) {
        const type = byte();
        if (type === 0x63 || type === 0x64) leb();
        skipLimits();
      } else if (kind === 0x02) {
        skipLimits();
      } else if (kind === 0x03) {
        const type = byte();
        if (type === 0x63 || type === 0x64) leb();
        byte(); // mutability
      } else if (kind === 0x04) {
        leb(); // its attribute, a LEB that V8 also reads padded (red team 3: 80 00 put this reader a byte behind)
        leb();
      } else {
        // Not reached with today's V8, which refuses other kinds; one it learns later is not read blind.
        return `its import ${i} is of kind 0x${kind.toString(16)}, which the host does not read; a policy imports functions, tables, memories, globals and tags`;
      }
    }
  } catch (error) {
    if (!(error instanceof ImportsUnread || error instanceof MemoryCapError)) throw error;
  }
  // V8 compiled it, so this is a misreading here (red team 3: a padded tag attribute put it a byte
  // behind): refused rather than let a signature go unchecked.
  if (i < count || at !== end) return `its import section could not be read to its end here (import ${i} of ${count}), so its host functions' signatures are unchecked`;
  return undefined;

  function skipLimits(): void {
    const flags = byte();
    leb();
    if (flags & 0x01) leb();
  }
}

/** This reader lost its place in a section V8 read: see the end of kernelImportProblem. */
class ImportsUnread extends Error {}

function readTypes(bytes: Uint8Array, start: number, end: number): Signature[] {
  const [count, countLength] = readLeb(bytes, start, end);
  let at = start + countLength;
  const types: Signature[] = [];
  for (let i = 0; i < count && at < end; i++) {
    at++; // 0x60: readLayout refused any other form
    const vectors: Value[][] = [];
    for (let vector = 0; vector < 2; vector++) {
      const [length, lengthBytes] = readLeb(bytes, at, end);
      at += lengthBytes;
      const values: Value[] = [];
      for (let t = 0; t < length && at < end; t++) {
        const type = bytes[at++]!;
        if (type === 0x63 || type === 0x64) {
          at += readLeb(bytes, at, end)[1];
          values.push('ref');
        } else {
          values.push(VALUE_NAMES.get(type) ?? 'ref');
        }
      }
      vectors.push(values);
    }
    types.push({ params: vectors[0]!, results: vectors[1]! });
  }
  return types;
}

function matches(declared: Signature, wanted: Signature): boolean {
  const param = (given: Param, want: Param) => given === want || (want === 'i32|i64' && (given === 'i32' || given === 'i64'));
  return declared.params.length === wanted.params.length && declared.results.length === wanted.results.length &&
    declared.params.every((p, i) => param(p, wanted.params[i]!)) && declared.results.every((r, i) => r === wanted.results[i]);
}

const show = (s: Signature): string => `(${s.params.join(', ')}) -> (${s.results.join(', ')})`;
