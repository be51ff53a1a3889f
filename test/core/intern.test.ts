// Interner (src/core/intern.ts): the same text back, whatever was interned before; bounded.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { Interner } from '../../src/core/intern.ts';

test('an interned text is the text given, for any sequence of texts; the size never passes the bound', () => {
  fc.assert(
    fc.property(fc.array(fc.string({ maxLength: 6 }), { maxLength: 200 }), fc.integer({ min: 1, max: 20 }), (texts, max) => {
      const i = new Interner(max);
      for (const t of texts) {
        assert.equal(i.get(t), t);
        assert.ok(i.size <= max);
      }
    }),
  );
});

test('a full Interner starts again from empty rather than growing', () => {
  const i = new Interner(3);
  for (const t of ['a', 'b', 'c']) i.get(t);
  assert.equal(i.size, 3);
  i.get('a');
  assert.equal(i.size, 3, 'a text already held adds nothing');
  i.get('d');
  assert.equal(i.size, 1);
});

test('the copy is made once per text held, and every later get returns that copy', () => {
  const copies: string[] = [];
  const i = new Interner(10, (t) => {
    const c = `${t}`;
    copies.push(c);
    return c;
  });
  const first = i.get('tcp');
  assert.equal(i.get('tcp'), first);
  assert.equal(i.get(['t', 'c', 'p'].join('')), first);
  assert.equal(copies.length, 1);
  i.get('udp');
  assert.deepEqual(copies, ['tcp', 'udp']);
});
