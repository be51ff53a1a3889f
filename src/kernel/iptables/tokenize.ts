// The one iptables tokenizer: a rule line split into words as iptables-restore reads it.
// Every reader of iptables-save / iptables-restore text in kproxy (the tracer's parser, the
// save reader, the proxiers) splits with it. Pure.

export interface Tokens {
  words: string[];
  /** words[i] was (partly) quoted or escaped: a quoted "!" is a value, not a negation */
  quoted: boolean[];
}

/**
 * Splits a line like iptables-restore does: whitespace separates words, double quotes
 * group, a backslash takes the next character literally (also inside double quotes, which
 * is how iptables-save escapes `"` and `'` in comments). A single quote is an ordinary
 * character, as for iptables-restore (`--comment it's` is one word). Null on an
 * unterminated double quote.
 */
export function tokenize(line: string): Tokens | null {
  if (!/["\\]/.test(line)) {
    const words = line.split(/\s+/).filter((w) => w !== '');
    return { words, quoted: new Array(words.length).fill(false) };
  }
  const words: string[] = [];
  const quoted: boolean[] = [];
  let cur = '';
  let inWord = false;
  let wasQuoted = false;
  let i = 0;
  const n = line.length;
  while (i < n) {
    const c = line.charCodeAt(i);
    if (c === 32 /* space */ || c === 9 /* tab */) {
      if (inWord) {
        words.push(cur);
        quoted.push(wasQuoted);
        cur = '';
        inWord = false;
        wasQuoted = false;
      }
      i++;
      continue;
    }
    inWord = true;
    if (c === 92 /* \ */) {
      if (i + 1 < n) cur += line[i + 1];
      wasQuoted = true;
      i += 2;
      continue;
    }
    if (c === 34 /* " */) {
      const end = readDoubleQuoted(line, i + 1);
      if (!end) return null;
      cur += end.text;
      wasQuoted = true;
      i = end.next;
      continue;
    }
    // A run of ordinary characters, appended as one slice.
    let j = i + 1;
    while (j < n) {
      const d = line.charCodeAt(j);
      if (d === 32 || d === 9 || d === 92 || d === 34) break;
      j++;
    }
    cur += line.slice(i, j);
    i = j;
  }
  if (inWord) {
    words.push(cur);
    quoted.push(wasQuoted);
  }
  return { words, quoted };
}

/** Text of a double-quoted string starting after its opening quote; a backslash escapes. */
function readDoubleQuoted(line: string, from: number): { text: string; next: number } | null {
  let text = '';
  let i = from;
  for (;;) {
    const q = line.indexOf('"', i);
    const b = line.indexOf('\\', i);
    if (q < 0) return null;
    if (b >= 0 && b < q) {
      text += line.slice(i, b) + (line[b + 1] ?? '');
      i = b + 2;
      continue;
    }
    return { text: text + line.slice(i, q), next: q + 1 };
  }
}

/**
 * Splits an iptables-save rule line into arguments with the tokenizer; a line with an
 * unterminated quote splits on whitespace.
 */
export function splitRuleArgs(line: string): string[] {
  return tokenize(line)?.words ?? line.split(/\s+/).filter((w) => w !== '');
}

/** Quotes one argument for an iptables-restore line, so that tokenize reads it back as is. */
export function quoteArg(a: string): string {
  return /[\s"'\\]/.test(a) || a === '' ? `"${a.replace(/(["\\])/g, '\\$1')}"` : a;
}
