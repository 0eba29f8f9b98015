// The configuration's YAML is read in bounded time and memory (config/yaml.ts). Red team 12: a
// settings map of 36,000 keys took the main thread 48 s to reload (the yaml package's unique-key
// check is quadratic), and 8 MiB of `[[[...` ran the heap out and ended the process.
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it, onTestFinished } from 'vitest';
import { loadConfigFile, MAX_CONFIG_BYTES, parseConfig } from '../../host/src/config/load.ts';
import { MAX_READ_JSON_CHARS, READ_APART_FROM_BYTES, readYaml, readYamlBounded, ReadRefused, YamlProblem } from '../../host/src/config/yaml.ts';

async function file(text: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'portcullis-yaml-'));
  onTestFinished(() => rm(dir, { recursive: true, force: true }));
  const path = join(dir, 'portcullis.yaml');
  await writeFile(path, text);
  return path;
}

/** A configuration whose one policy has `settings` written as YAML at the given indent. */
const withSettings = (settings: string) => `policies:\n  - name: a\n    module: a.wasm\n    settings:\n${settings}`;

describe('the configuration\'s YAML', () => {
  it('refuses a map that gives a key twice, saying which and where, as JSON would collapse it', () => {
    expect(() => parseConfig('policies: []\nserver: {}\npolicies: []\n', 'c.yaml'))
      .toThrow('c.yaml: not valid YAML: Map keys must be unique; "policies" is given twice, at line 3, column 1');
    // 1 and "1" are different YAML keys and the same JSON key.
    expect(() => readYaml('a:\n  1: x\n  "1": y\n')).toThrow(new YamlProblem('Map keys must be unique; "1" is given twice, at line 3, column 3'));
    expect(readYaml('a: { b: 1 }\nc: { b: 2 }\n')).toEqual({ a: { b: 1 }, c: { b: 2 } });
    // Keys as JSON names them (review): null is "", an alias is what it stands for; a list or map as a key has no JSON form.
    expect(() => readYaml('~: a\n"": b\n')).toThrow(new YamlProblem('Map keys must be unique; "" is given twice, at line 2, column 1'));
    expect(() => readYaml('&k team: a\n*k : b\n')).toThrow(new YamlProblem('Map keys must be unique; "team" is given twice, at line 2, column 1'));
    expect(() => readYaml('? [a]\n: 1\n')).toThrow(new YamlProblem('Map keys must be strings, numbers or booleans; a list or a map as a key has no JSON form, at line 1, column 3'));
  });

  it('reads a short file with many aliases on a thread of its own too (red team 13: 21,000 in 64 KB held the main thread 5 s)', async () => {
    // The anchor named anew every 100 items, so that no alias is expanded more than MAX_ALIAS_COUNT allows.
    const aliases = Array.from({ length: 40 }, () => `&a 1${',*a'.repeat(99)}`).join(',');
    const text = withSettings(`      x: [${aliases}]\n`);
    expect(Buffer.byteLength(text)).toBeLessThan(READ_APART_FROM_BYTES);
    let ticks = 0;
    const ticker = setInterval(() => ticks++, 5);
    try {
      const value = await readYamlBounded(text) as { policies: { settings: { x: number[] } }[] };
      expect(value.policies[0]!.settings.x).toEqual(Array(4000).fill(1));
    } finally {
      clearInterval(ticker);
    }
    expect(ticks).toBeGreaterThan(2);
  }, 30_000);

  it('refuses a file whose aliases expand it past MAX_READ_JSON_CHARS of JSON, and says too many aliases as a small file does', async () => {
    const list = `[${Array(10_000).fill('1').join(',')}]`;
    const anchors = Array.from({ length: 20 }, (_, i) => `a${i}: &l${i} ${list}`).join('\n');
    const uses = Array.from({ length: 20 }, (_, i) => `u${i}: [${Array(99).fill(`*l${i}`).join(',')}]`).join('\n');
    await expect(readYamlBounded(`${anchors}\n${uses}\n`)).rejects.toThrow(new ReadRefused(`it expands to more than ${MAX_READ_JSON_CHARS / 2 ** 20} Mi characters of JSON (aliases repeat what they name); it is refused`));
    const many = `a: &a [1]\nb: [${Array(101).fill('*a').join(',')}]\n# ${'-'.repeat(READ_APART_FROM_BYTES)}\n`;
    await expect(readYamlBounded(many)).rejects.toThrow(YamlProblem);
    await expect(readYamlBounded(many)).rejects.toThrow(/Excessive alias count/);
  }, 60_000);

  it('reads a settings map of 36,000 keys (1 MB, red team 12) on a thread of its own, with every key, while this thread runs on', async () => {
    const keys = Array.from({ length: 36_000 }, (_, i) => `        image-${i}: allowed\n`).join('');
    const path = await file(withSettings(`      allow:\n${keys}`));
    let ticks = 0;
    const ticker = setInterval(() => ticks++, 5);
    try {
      const config = await loadConfigFile(path);
      expect(Object.keys((config.policies[0]!.settings as { allow: object }).allow)).toHaveLength(36_000);
    } finally {
      clearInterval(ticker);
    }
    // The old reading held this thread for the whole read (48 s in the red team's run): no tick at all.
    expect(ticks).toBeGreaterThan(2);
    await expect(loadConfigFile(await file(withSettings(`      allow:\n${keys}        image-7: twice\n`))))
      .rejects.toThrow(/not valid YAML: Map keys must be unique; "image-7" is given twice, at line 36006, column 9/);
  }, 60_000);

  it('refuses a file of MAX_CONFIG_BYTES nested as deep as it goes, and the process lives on (it ran out of heap)', async () => {
    const depth = MAX_CONFIG_BYTES / 2 - 100;
    const path = await file(withSettings(`      x: ${'['.repeat(depth)}${']'.repeat(depth)}\n`));
    await expect(loadConfigFile(path)).rejects.toThrow(/portcullis\.yaml: (it is nested too deeply to read|reading it needed more than 256 MiB)/);
  }, 60_000);

  it('refuses a large file that takes longer than its time to read, and one that needs more heap than it has', async () => {
    const list = `a: [${Array.from({ length: 200_000 }, () => '1').join(',')}]\n`;
    expect(Buffer.byteLength(list)).toBeGreaterThan(READ_APART_FROM_BYTES);
    await expect(readYamlBounded(list, { ms: 1 })).rejects.toThrow(new ReadRefused('reading it took longer than 0.001 s; it is refused (is it far larger or more deeply nested than a configuration needs to be?)'));
    await expect(readYamlBounded(list, { heapMiB: 4 })).rejects.toThrow(new ReadRefused('reading it needed more than 4 MiB; it is refused (is it far larger or more deeply nested than a configuration needs to be?)'));
    expect(await readYamlBounded(list)).toEqual({ a: Array.from({ length: 200_000 }, () => 1) });
  }, 60_000);

  it('says a large file\'s YAML problem and a value JSON cannot hold as it does a small one\'s', async () => {
    const pad = `# ${'-'.repeat(READ_APART_FROM_BYTES)}\n`;
    for (const [text, message] of [
      ['policies: [\n', 'not valid YAML: '],
      [withSettings('      labels: !!set { team }\n'), '/policies/0/settings/labels is a YAML !!set, which JSON has no form for'],
    ] as const) {
      const small = (() => { try { parseConfig(text, 'c.yaml'); return ''; } catch (error) { return (error as Error).message; } })();
      expect(small).toContain(message);
      await expect(loadConfigFile(await file(pad + text))).rejects.toThrow(message);
    }
  }, 30_000);
});
