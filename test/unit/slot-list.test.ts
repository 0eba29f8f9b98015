import { describe, expect, it } from 'vitest';
import { SlotList } from '../../host/src/util/slot-list.ts';

describe('SlotList', () => {
  it('holds items until released, lists those held, and reuses the slots released', () => {
    const list = new SlotList<{ n: number }>();
    const [a, b, c] = [{ n: 1 }, { n: 2 }, { n: 3 }];
    const releaseA = list.add(a);
    const releaseB = list.add(b);
    expect(list.size).toBe(2);
    expect([...list]).toEqual([a, b]);
    releaseA();
    releaseA(); // a second call frees nothing more
    expect(list.size).toBe(1);
    expect([...list]).toEqual([b]);
    list.add(c); // into a's slot
    expect([...list]).toEqual([c, b]);
    releaseB();
    expect(list.size).toBe(1);
    expect([...list]).toEqual([c]);
  });
});
