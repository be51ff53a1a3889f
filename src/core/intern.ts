// One copy of a text that many kept objects repeat. Each parsed API object carries its own copy
// of every string in it (JSON.parse and the YAML parsers share none), so the namespace of
// 10,000 Services, the node name of 50,000 endpoints or the zone of each are as many strings
// as there are objects; kept through an Interner, they are one string each. Pure.

/**
 * The first copy seen of each text, up to `max` texts: then it starts again from empty, so
 * names that come and go over a long run never pile up (a text interned again after that is
 * only a second copy, never a wrong one). `copy` makes the copy kept from the first one seen
 * (e.g. a flat one, src/core/flat.ts).
 */
export class Interner {
  private readonly texts = new Map<string, string>();

  constructor(
    private readonly max = 10_000,
    private readonly copy: (text: string) => string = (t) => t,
  ) {}

  get(text: string): string {
    const hit = this.texts.get(text);
    if (hit !== undefined) return hit;
    if (this.texts.size >= this.max) this.texts.clear();
    const kept = this.copy(text);
    this.texts.set(kept, kept);
    return kept;
  }

  /** How many texts it holds (tests). */
  get size(): number {
    return this.texts.size;
  }
}
