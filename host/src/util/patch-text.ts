// A JSONPatch kept as the JSON text a thread made of it, with its count of operations. Threads
// hand patches to each other and to the response this way: a structured clone or a parse of a
// large patch costs the receiving thread by its count of values (red team 11), a string does not.
import type { PatchOperation } from '@portcullis/sdk';

export interface PatchText {
  readonly json: string;
  /** How many operations the text holds. */
  readonly length: number;
}

/** A patch as its operations or as text. */
export type SomePatch = PatchOperation[] | PatchText;

/** The operations of a patch, parsing them if they came as text. */
export function operationsOf(patch: SomePatch): PatchOperation[] {
  return Array.isArray(patch) ? patch : JSON.parse(patch.json) as PatchOperation[];
}
