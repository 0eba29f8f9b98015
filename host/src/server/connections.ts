// How many connections the webhook port holds, and whose go first when it is full. Idle
// connections are left for the caller to close (the apiserver reuses them; closing one races
// with a call it is writing), so they are bounded by count: each TLS one costs ~60 KB, and
// 14,000 from one client took the host to the pod's 1 GiB limit (red team). Refusing new
// connections at the cap was no better: 4,096 idle keep-alive connections from one client then
// locked every other caller out (re-test). Near the cap, the idle connections of the address
// holding the most are closed instead: an apiserver under load keeps its connections busy.
import type { Server } from 'node:http';
import type { Socket } from 'node:net';

/** Share of maxConnections past which idle connections of the biggest holder are closed. */
const EVICT_FROM = 0.9;

export interface ConnectionLimits {
  maxConnections: number;
  maxConnectionsPerAddress: number;
}

/** `refused()`: counts a connection closed by these limits. `tls`: requests arrive on TLS sockets. */
export function limitConnections(server: Server, limits: ConnectionLimits, tls: boolean, refused: () => void): void {
  // Past it Node closes new connections itself; eviction keeps the count below it.
  server.maxConnections = limits.maxConnections;
  // A connection Node dropped at the cap makes room for the next one (the cap can be reached
  // without eviction: connections that arrive below EVICT_FROM and stay).
  server.on('drop', () => {
    refused();
    evictIdle();
  });
  const byAddress = new Map<string, Set<Socket>>();
  // Requests in flight per socket (the TLS socket for HTTPS: what requests arrive on).
  const inFlight = new WeakMap<Socket, number>();
  let open = 0;
  server.on('request', (req, res) => {
    const socket = req.socket;
    inFlight.set(socket, (inFlight.get(socket) ?? 0) + 1);
    res.once('close', () => inFlight.set(socket, (inFlight.get(socket) ?? 1) - 1));
  });
  const track = (socket: Socket, address: string) => {
    let sockets = byAddress.get(address);
    if (!sockets) byAddress.set(address, sockets = new Set());
    sockets.add(socket);
    socket.once('close', () => {
      sockets.delete(socket);
      if (sockets.size === 0 && byAddress.get(address) === sockets) byAddress.delete(address);
    });
  };
  // Raw sockets whose TLS handshake has not finished, by their peer's address and port. They
  // count toward the cap like any other: two addresses holding 2,048 such connections each (no
  // certificate needed) locked every other caller out until the handshake timeout (red team).
  const handshaking = new Map<string, Socket>();
  const peer = (socket: Socket) => `${socket.remoteAddress ?? ''} ${socket.remotePort ?? ''}`;
  // The raw TCP socket counts; the socket requests arrive on (for HTTPS, its TLS socket once the
  // handshake is done) is what may be evicted, and so is a raw socket still in its handshake.
  server.on('connection', (socket: Socket) => {
    const address = socket.remoteAddress ?? '';
    if ((byAddress.get(`raw ${address}`)?.size ?? 0) >= limits.maxConnectionsPerAddress) {
      refused();
      return void socket.destroy();
    }
    track(socket, `raw ${address}`);
    if (!tls) track(socket, address);
    else {
      const key = peer(socket);
      handshaking.set(key, socket);
      socket.once('close', () => { if (handshaking.get(key) === socket) handshaking.delete(key); });
    }
    open++;
    socket.once('close', () => open--);
    if (open >= limits.maxConnections * EVICT_FROM) evictIdle(socket);
  });
  server.on('secureConnection', (socket: Socket) => {
    handshaking.delete(peer(socket));
    track(socket, socket.remoteAddress ?? '');
  });

  /**
   * The address holding the most connections loses half of them: those still in their handshake
   * first (the oldest first: a real client's handshake takes milliseconds), then idle ones.
   * `arriving`, the connection that got here, is a newcomer this makes room for.
   */
  function evictIdle(arriving?: Socket): void {
    let biggest: string | undefined;
    let most = 0;
    for (const [address, sockets] of byAddress) {
      if (address.startsWith('raw ') && sockets.size > most) [biggest, most] = [address.slice(4), sockets.size];
    }
    if (biggest === undefined) return;
    // Half of them at a time, so a burst of new connections does not evict on every one.
    let budget = Math.max(1, Math.floor(most / 2));
    for (const socket of byAddress.get(`raw ${biggest}`)!) {
      if (budget === 0) return;
      if (socket === arriving || handshaking.get(peer(socket)) !== socket) continue;
      socket.destroy();
      refused();
      budget--;
    }
    for (const socket of byAddress.get(biggest) ?? []) {
      if (budget === 0) return;
      if ((inFlight.get(socket) ?? 0) > 0) continue;
      socket.destroy();
      refused();
      budget--;
    }
  }
}
