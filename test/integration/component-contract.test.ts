// A component must import and export the contract's interfaces with the contract's types
// (wit/policy.wit), not only its names: jco's glue lifts whatever the types say, in JavaScript,
// in the thread that runs the guest (red team: a `log` taking `list<string>` decoded 2,000 views
// of one 64 KiB slice per call, in the main thread once the inline lane took it).
import { expect, it } from 'vitest';
import { prepareSandbox } from '../../host/src/sandbox/prepare.ts';
import { DEFAULT_LIMITS } from '../../host/src/config/limits.ts';

/** A component exporting the policy interface, whose `log` import and `validate` export have the given types. */
async function component(logParams: string, validateResult = 'string'): Promise<Uint8Array> {
  const { parse } = await import('@bytecodealliance/jco');
  return parse(`(component
    (type $hostT (instance
      (type $l (enum "debug" "info" "warn" "error"))
      (export "level" (type $level (eq $l)))
      (export "log" (func ${logParams}))))
    (import "portcullis:policy/host@0.1.0" (instance $host (type $hostT)))
    (core module $M
      (memory (export "memory") 1)
      (func (export "realloc") (param i32 i32 i32 i32) (result i32) (i32.const 1024))
      (func (export "f0") (result i32) (i32.const 0))
      (func (export "f1") (param i32 i32) (result i32) (i32.const 0)))
    (core instance $m (instantiate $M))
    (alias core export $m "memory" (core memory $memory))
    (func $metadata (result string) (canon lift (core func $m "f0") (memory $memory) (realloc (core func $m "realloc"))))
    (func $s (param "input" string) (result string) (canon lift (core func $m "f1") (memory $memory) (realloc (core func $m "realloc"))))
    (func $v (param "input" string) (result ${validateResult}) (canon lift (core func $m "f1") (memory $memory) (realloc (core func $m "realloc"))))
    (instance $policy (export "metadata" (func $metadata)) (export "validate-settings" (func $s)) (export "validate" (func $v)) (export "mutate" (func $s)))
    (export "portcullis:policy/policy@0.1.0" (instance $policy)))`);
}

it('refuses a component whose host log takes other types than the contract says', async () => {
  await expect(prepareSandbox('list-log', await component('(param "message" (list string))'), DEFAULT_LIMITS, false))
    .rejects.toThrow(/^its portcullis:policy\/host interface does not have the contract's types \(wit\/policy.wit\)\. It declares: export function log\(_: Array<string>\): void; .*Build it with `portcullis build`$/);
  await expect(prepareSandbox('string-level', await component('(param "level" string) (param "message" string)'), DEFAULT_LIMITS, false))
    .rejects.toThrow(/portcullis:policy\/host interface does not have the contract's types .* export function log\(_: string, _: string\): void;/);
});

it('refuses a component whose policy functions answer other types than the contract says', async () => {
  await expect(prepareSandbox('list-answer', await component('(param "level" $level) (param "message" string)', '(list string)'), DEFAULT_LIMITS, false))
    .rejects.toThrow(/its portcullis:policy\/policy interface does not have the contract's types .* export function validate\(_: string\): Array<string>;/);
});

it('takes one with the contract\'s types, whatever it names the parameters', async () => {
  const spec = await prepareSandbox('renamed', await component('(param "lvl" $level) (param "text" string)'), DEFAULT_LIMITS, false);
  expect(spec.kind).toBe('component');
});
