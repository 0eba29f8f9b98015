// Evaluated before a policy's own code inside the component (the generated entry imports it
// first). The sandbox gives a policy no clock, no timers and no entropy: without this, reaching
// for them ends in a bare `unreachable` trap from the stubbed WASI import. (Math.random stays:
// it is seeded the same in every instance, so it is repeatable, and libraries call it.) Here they throw an
// error that says what the policy did and why it cannot, which the host reports as a crash.
// Not part of the policy API, and never imported outside a component.
import { hostLog, type LogLevel } from './policy.ts';

const unavailable = (what: string, why: string) => (): never => {
  throw new Error(`${what} is not available in a policy: ${why}`);
};
const NO_CLOCK = 'the sandbox has no clock (a decision must not depend on the time; pass a time in settings if you need one)';

const RealDate = Date;
class SandboxDate extends RealDate {
  constructor(...args: ConstructorParameters<DateConstructor> | []) {
    if (args.length === 0) unavailable('new Date() without arguments', NO_CLOCK)();
    super(...(args as ConstructorParameters<DateConstructor>));
  }
}
// Inherited builtins are read-only for assignment: define over them instead.
// Some are fixed in place by the engine: those are left alone (they trap instead of throwing).
const replace = (target: object, name: string, value: unknown): void => {
  try {
    Object.defineProperty(target, name, { value, configurable: true, writable: true });
  } catch {
    try {
      (target as Record<string, unknown>)[name] = value;
    } catch { /* fixed by the engine */ }
  }
};
replace(SandboxDate, 'now', unavailable('Date.now()', NO_CLOCK));
replace(globalThis, 'Date', SandboxDate);
// QuickJS's performance.now cannot be redefined in place: replace the whole object.
replace(globalThis, 'performance', Object.freeze({ now: unavailable('performance.now()', NO_CLOCK) }));
for (const timer of ['setTimeout', 'setInterval', 'setImmediate']) {
  replace(globalThis, timer, unavailable(`${timer}()`, 'a policy runs to completion within one call; there is no event loop to come back to'));
}

// `console` type-checks in a policy (the DOM and Node typings both declare it) but the engine has
// none: `console.log` crashed every evaluation (newcomer). It writes to the host log, as ctx.log
// does, each argument as a string or as JSON.
const text = (value: unknown): string => {
  if (typeof value === 'string') return value;
  if (value instanceof Error) return value.stack ?? `${value.name}: ${value.message}`;
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value); // a cycle, or a BigInt
  }
};
const writer = (level: LogLevel) => (...values: unknown[]): void => hostLog(level, values.map(text).join(' '));
replace(globalThis, 'console', Object.freeze({
  log: writer('info'), info: writer('info'), warn: writer('warn'), error: writer('error'), debug: writer('debug'), trace: writer('debug'),
}));
