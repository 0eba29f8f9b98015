// Imported for its effect, before any WebAssembly is compiled in this process: V8's flags are
// the process's, so this holds for the main thread, every sandbox worker and the inline lane.
//
// With V8's dynamic tiering, Liftoff code looks for interrupts in a loop only when the loop's
// tier-up budget runs out, and that budget is counted in the loop's bytes, not its time. A
// loop around one large memory.fill, memory.copy or table.fill (16 MiB each turn) went minutes
// between looks, so worker.terminate() at the CPU deadline did not stop it: the call was
// answered on time, but its thread spun on for good, and the host could not exit (red team:
// four such calls, four threads at 100% of a core, 120 MB more RSS; plain Node shows the same).
// Without dynamic tiering every loop looks at each turn. V8 then compiles a function with
// Liftoff on its first call, as before, and with TurboFan in the background at once.
import v8 from 'node:v8';

export const WASM_TIERING_FLAG = '--no-wasm-dynamic-tiering';
v8.setFlagsFromString(WASM_TIERING_FLAG);
