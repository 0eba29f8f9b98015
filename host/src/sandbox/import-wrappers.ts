// Keeps V8 from compiling wasm-to-JavaScript import wrappers, the code behind a crash of the
// whole host: `Check failed: jit_page.has_value()` (SIGTRAP), met in three CI runs.
//
// The V8 of Node 24 keeps compiled import wrappers in one cache for the whole process, shared by
// every thread, counted by reference and freed when the last instance using one dies. That
// freeing can unregister code the JIT-page registry no longer knows (nodejs/node#64500; the
// crash's stack, symbolized against our Node binary: InstanceBuilder::ProcessImportedFunction ->
// ~WasmCodeRefScope -> WasmEngine::FreeDeadCode -> WasmImportWrapperCache::Free ->
// ThreadIsolation::UnregisterWasmAllocation). Sandboxes make and drop instances in many threads
// all the time, so the host meets it. A wrapper is compiled, or a reference to the cached one
// taken, in two cases, and we avoid both:
// - an import that is not a plain function (a bound one, a proxy, a class): Extism binds every
//   host function we give it, so ours answer `bind` with a plain closure (plainBind), and a
//   component's glue may give its core modules only the host's wrappers or wasm functions (guest.ts);
// - an import called more times than the tier-up budget: raised here to V8's most, and an
//   instance is made again long before its calls could reach it (MAX_HOST_CALLS_PER_INSTANCE).
// What the guests then call through is V8's generic wrapper, built in and never freed. The same
// budget also keeps V8 from tiering up JavaScript-to-wasm export wrappers; neither showed in the
// benchmark's guest-call rows.
import { setFlagsFromString } from 'node:v8';

/** Calls through one import of one instance before V8 compiles it a wrapper: the most V8 takes. */
const NEVER = 2 ** 31 - 1;

/**
 * Host calls an instance may make in its life, every import together. V8 counts each import's
 * calls per instance against the budget above, and an instance that lived on would reach even
 * that (review: 2^31 calls of one import in ~90 s; red team 9: one call of 75 s under
 * `run --timeout-ms`, and a wrapper). A call that passes this traps; a sandbox makes the instance
 * again after any call that leaves it past half of it (worker.ts, inline-lane.ts), so a policy
 * meets the limit only within one call, which at ~35 ns a host call here takes 37 s.
 */
export const MAX_HOST_CALLS_PER_INSTANCE = 2 ** 30;

let set = false;

/**
 * Sets V8's wrapper tier-up budget for the process. V8 reads it when it makes an instance, so
 * this runs before the first sandbox is made: guest.ts calls it as it loads. The CLI sets the
 * same flag in bin/portcullis.js, earlier still (before Node's type stripper makes its instance).
 */
export function keepImportWrappersGeneric(): void {
  if (set) return;
  set = true;
  setFlagsFromString(`--wasm-wrapper-tiering-budget=${NEVER}`);
}

/**
 * The function itself, whose `bind(thisArg, ...bound)` gives a plain closure instead of a bound
 * function (`this` is not used), after telling `onBind` what it binds: for a bound import V8
 * takes a shared compiled wrapper at every instantiation.
 */
export function plainBind<F extends (...args: never[]) => unknown>(fn: F, onBind?: (bound: unknown[]) => void): F {
  const call = fn as unknown as (...args: unknown[]) => unknown;
  return Object.defineProperty(fn, 'bind', {
    configurable: true,
    value: (_thisArg: unknown, ...bound: unknown[]) => {
      onBind?.(bound);
      return (...args: unknown[]) => call(...bound, ...args);
    },
  });
}
