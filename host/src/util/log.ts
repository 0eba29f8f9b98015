// Structured logs: one JSON object per line on stderr. Callers pass fields, never whole
// objects or header values; the review log carries uid, policy, decision and duration.
export type Level = 'debug' | 'info' | 'warn' | 'error';
const ORDER: Record<Level, number> = { debug: 10, info: 20, warn: 30, error: 40 };

export type Fields = Record<string, string | number | boolean | null | undefined | string[]>;

export interface Logger {
  level: Level;
  debug(message: string, fields?: Fields): void;
  info(message: string, fields?: Fields): void;
  warn(message: string, fields?: Fields): void;
  error(message: string, fields?: Fields): void;
  enabled(level: Level): boolean;
}

export function createLogger(level: Level = 'info', write: (line: string) => void = (line) => process.stderr.write(line)): Logger {
  const logger: Logger = {
    level,
    enabled: (at) => ORDER[at] >= ORDER[logger.level],
    debug: (message, fields) => emit('debug', message, fields),
    info: (message, fields) => emit('info', message, fields),
    warn: (message, fields) => emit('warn', message, fields),
    error: (message, fields) => emit('error', message, fields),
  };
  function emit(at: Level, message: string, fields?: Fields): void {
    if (!logger.enabled(at)) return;
    write(`${JSON.stringify({ time: new Date().toISOString(), level: at, msg: message, ...fields })}\n`);
  }
  return logger;
}
