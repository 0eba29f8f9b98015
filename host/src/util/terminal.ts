// Whether the terminal the host was started from has gone. Closing it sends SIGHUP, which the
// host otherwise reads the daemon's way, as "reload the configuration": `npx portcullis serve`
// in a terminal that was then closed went on serving, orphaned, holding its port (npx and the
// shell exited; the host reloaded). A hung-up terminal fails every ioctl, so isatty() turns
// false on the descriptors that were terminals; `kill -HUP` with the terminal open leaves them.
import { isatty } from 'node:tty';

const attached = [0, 1, 2].filter((fd) => isatty(fd));

/** True once a descriptor that was a terminal at start is no longer one. */
export function terminalHungUp(): boolean {
  return attached.some((fd) => !isatty(fd));
}
