// Preload (`node --import ./bench/reuse-port.ts ...`) for bench/intake.ts only: every server
// this process listens with SO_REUSEPORT, so that several processes can share one port and the
// kernel spreads connections among them. Portcullis itself has no such option.
import { Server } from 'node:net';

// eslint-disable-next-line @typescript-eslint/unbound-method -- called with the server as `this` below
const listen = Server.prototype.listen;
Server.prototype.listen = function (this: Server, ...args: unknown[]) {
  const [first] = args;
  if (typeof first === 'object' && first !== null && !Array.isArray(first)) {
    args[0] = { ...(first), reusePort: true };
  } else if (typeof first === 'number' || (typeof first === 'string' && /^\d+$/.test(first))) {
    const host = typeof args[1] === 'string' ? args[1] : undefined;
    const callback = args.find((a) => typeof a === 'function');
    return listen.call(this, { port: Number(first), ...(host ? { host } : {}), reusePort: true }, callback as () => void);
  }
  return listen.apply(this, args as Parameters<typeof listen>);
} as typeof Server.prototype.listen;
