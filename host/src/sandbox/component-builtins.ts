// Which canonical definitions a component may hold. jco's glue implements the component
// model's built-ins in JavaScript, in the worker: their state (error-context strings, resource
// handle tables, async tasks and their callbacks) lives on the worker's heap, where the memory
// cap does not reach, and an async task's callback runs from a timer after its call has
// answered, when the pool believes the worker idle (red team 6: a 1 KB component grew the host
// by 40 MiB a review with error-context.new; a million resource.new a call took 900 MiB past a
// 64 MiB cap; an async callback looped in a worker between calls, and the next policy sent
// there was blamed for its deadline).
//
// A policy needs none of them: its contract (wit/policy.wit) is synchronous functions on
// strings. So a component may only lift and lower functions synchronously, and make, read and
// drop resources of its own (the toolchain's WASI plumbing declares a few; their handle tables
// are capped in the glue, glue.ts capResourceTables). Anything else is refused before jco sees
// the component. The walk is bounded like memory-cap.ts's: every size is checked against the
// bytes it claims, and sections and nesting are capped, so a crafted header costs microseconds.

/** Real policies nest components three deep and hold under a thousand sections in all. */
const MAX_DEPTH = 16;
const MAX_SECTIONS = 50_000;

const NESTED_COMPONENT_SECTION = 4;
const CANON_SECTION = 8;

const CANON_LIFT = 0x00;
const CANON_LOWER = 0x01;
const CANON_RESOURCE_NEW = 0x02;
const CANON_RESOURCE_DROP = 0x03;
const CANON_RESOURCE_REP = 0x04;
/** More resource types than any toolchain's plumbing declares: each is a handle table in the glue. */
const MAX_RESOURCE_TYPES = 64;

/** Lift and lower options: string encodings (no operand), then memory, realloc and post-return (an index). */
const OPTION_WITHOUT_OPERAND = new Set([0x00, 0x01, 0x02]);
const OPTION_WITH_INDEX = new Set([0x03, 0x04, 0x05]);
const ASYNC_OPTIONS: Record<number, string> = { 0x06: 'async', 0x07: 'callback' };

export class ComponentBuiltinError extends Error {}

/** The component's bytes do not parse: said as jco's own refusals are. */
class MalformedComponentError extends ComponentBuiltinError {
  constructor(why: string) {
    super(`not a well-formed component: ${why}`);
  }
}

/** Throws ComponentBuiltinError, saying what and where, unless every canonical definition is one a policy may hold. */
export function checkComponentBuiltins(bytes: Uint8Array): { makesResources: boolean } {
  const state = { sections: 0, resourceNew: 0 };
  walkComponent(bytes, 8, bytes.length, 0, state);
  if (state.resourceNew > MAX_RESOURCE_TYPES) throw new ComponentBuiltinError(`it makes resources of ${state.resourceNew} types; a policy may make at most ${MAX_RESOURCE_TYPES}`);
  return { makesResources: state.resourceNew > 0 };
}

interface WalkState {
  sections: number;
  resourceNew: number;
}

function walkComponent(bytes: Uint8Array, start: number, end: number, depth: number, state: WalkState): void {
  if (depth > MAX_DEPTH) throw new MalformedComponentError(`components nest more than ${MAX_DEPTH} deep`);
  const at = { offset: start };
  while (at.offset < end) {
    if (++state.sections > MAX_SECTIONS) throw new MalformedComponentError(`the component has more than ${MAX_SECTIONS} sections`);
    const header = at.offset;
    const id = bytes[at.offset++]!;
    const size = readU32(bytes, at, end);
    const sectionEnd = at.offset + size;
    if (sectionEnd > end) throw new MalformedComponentError(`section ${id} at byte ${header} claims ${size} bytes, past the end of its component`);
    if (id === NESTED_COMPONENT_SECTION) {
      // A nested component has its own preamble (magic, version, layer).
      if (size < 8) throw new MalformedComponentError(`the nested component at byte ${header} is too short`);
      walkComponent(bytes, at.offset + 8, sectionEnd, depth + 1, state);
    } else if (id === CANON_SECTION) {
      readCanons(bytes, { offset: at.offset }, sectionEnd, state);
    }
    at.offset = sectionEnd;
  }
}

function readCanons(bytes: Uint8Array, at: { offset: number }, end: number, state: WalkState): void {
  const count = readU32(bytes, at, end);
  if (count > end - at.offset) throw new MalformedComponentError(`a canon section claims ${count} definitions in ${end - at.offset} bytes`);
  for (let i = 0; i < count; i++) {
    const where = at.offset;
    const kind = readByte(bytes, at, end);
    if (kind === CANON_LIFT || kind === CANON_LOWER) {
      readByte(bytes, at, end); // the `func` sort
      readU32(bytes, at, end);
      const options = readU32(bytes, at, end);
      if (options > end - at.offset) throw new MalformedComponentError(`a canon ${kind === CANON_LIFT ? 'lift' : 'lower'} at byte ${where} claims ${options} options`);
      for (let j = 0; j < options; j++) {
        const option = readByte(bytes, at, end);
        if (OPTION_WITH_INDEX.has(option)) readU32(bytes, at, end);
        else if (!OPTION_WITHOUT_OPERAND.has(option)) {
          const name = ASYNC_OPTIONS[option];
          throw new ComponentBuiltinError(name
            ? `it ${kind === CANON_LIFT ? 'lifts' : 'lowers'} a function with the \`${name}\` option (byte ${where}): async functions run callbacks after their call has answered, which a sandbox cannot bound`
            : `a canon ${kind === CANON_LIFT ? 'lift' : 'lower'} at byte ${where} has an option this host does not know (0x${option.toString(16)})`);
        }
      }
      if (kind === CANON_LIFT) readU32(bytes, at, end);
    } else if (kind === CANON_RESOURCE_NEW || kind === CANON_RESOURCE_DROP || kind === CANON_RESOURCE_REP) {
      if (kind === CANON_RESOURCE_NEW) state.resourceNew++;
      readU32(bytes, at, end);
    } else {
      throw new ComponentBuiltinError(`it uses the component model's built-in 0x${kind.toString(16)} at byte ${where} (an async, stream, future, error-context or thread built-in); ` +
        'a policy may only lift and lower functions synchronously: these keep state in the host, outside the memory cap, or run after the call has answered');
    }
  }
  if (at.offset !== end) throw new MalformedComponentError(`a canon section ends at byte ${at.offset}, not where its size says (${end})`);
}

function readByte(bytes: Uint8Array, at: { offset: number }, end: number): number {
  if (at.offset >= end) throw new MalformedComponentError(`a section runs past its end at byte ${at.offset}`);
  return bytes[at.offset++]!;
}

function readU32(bytes: Uint8Array, at: { offset: number }, end: number): number {
  let result = 0;
  for (let shift = 0; shift < 35; shift += 7) {
    const byte = readByte(bytes, at, end);
    result += (byte & 0x7f) * 2 ** shift;
    if ((byte & 0x80) === 0) {
      if (result > 0xffff_ffff) break;
      return result;
    }
  }
  throw new MalformedComponentError(`a malformed number at byte ${at.offset}`);
}
