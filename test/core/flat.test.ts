import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { flat } from '../../src/core/flat.ts';

test('a flat-tagged template has the text of the untagged one', () => {
  fc.assert(
    fc.property(fc.string(), fc.oneof(fc.string(), fc.integer()), fc.string(), fc.oneof(fc.string(), fc.double()), (a, b, c, d) => {
      assert.equal(flat`${a}`, `${a}`);
      assert.equal(flat`-A ${a} -m ${b} --x "${c}"${d}`, `-A ${a} -m ${b} --x "${c}"${d}`);
      assert.equal(flat`${a}${b}${c}${d}`, `${a}${b}${c}${d}`);
    }),
  );
  assert.equal(flat`no values`, 'no values');
  assert.equal(flat``, '');
  assert.equal(flat`${''}`, '');
});
