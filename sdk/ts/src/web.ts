// The web globals an actor may expect that the engine (QuickJS) lacks:
// `TextEncoder`, `TextDecoder` (UTF-8 only) and `URLSearchParams` (reading
// a query string). Installed by the SDK when it loads, only where the
// engine has none; `globals.d.ts` declares them for TypeScript.

/** UTF-8 bytes of `s` (a lone surrogate becomes U+FFFD, as in browsers). */
export function utf8Encode(s: string): Uint8Array {
  // Most text an actor writes is ASCII: one byte per character.
  const ascii = new Uint8Array(s.length);
  let i = 0;
  for (; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c >= 0x80) break;
    ascii[i] = c;
  }
  if (i === s.length) return ascii;
  return utf8EncodeFrom(s, ascii.subarray(0, i));
}

function utf8EncodeFrom(s: string, head: Uint8Array): Uint8Array {
  const out: number[] = Array.from(head);
  for (let i = head.length; i < s.length; i++) {
    let c = s.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length) {
      const d = s.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        c = 0x10000 + ((c - 0xd800) << 10) + (d - 0xdc00);
        i++;
      } else {
        c = 0xfffd;
      }
    } else if (c >= 0xd800 && c <= 0xdfff) {
      c = 0xfffd;
    }
    if (c < 0x80) out.push(c);
    else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 0x3f));
    else if (c < 0x10000) out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 0x3f), 0x80 | (c & 0x3f));
    else out.push(0xf0 | (c >> 18), 0x80 | ((c >> 12) & 0x3f), 0x80 | ((c >> 6) & 0x3f), 0x80 | (c & 0x3f));
  }
  return new Uint8Array(out);
}

/** The text of UTF-8 `bytes` (an invalid sequence becomes U+FFFD). */
export function utf8Decode(bytes: Uint8Array): string {
  let out = "";
  let i = 0;
  while (i < bytes.length) {
    const b = bytes[i];
    let c = 0xfffd;
    let n = 1;
    if (b < 0x80) {
      c = b;
    } else if (b >= 0xc2 && b < 0xe0 && i + 1 < bytes.length && (bytes[i + 1] & 0xc0) === 0x80) {
      c = ((b & 0x1f) << 6) | (bytes[i + 1] & 0x3f);
      n = 2;
    } else if (b >= 0xe0 && b < 0xf0 && i + 2 < bytes.length && (bytes[i + 1] & 0xc0) === 0x80 && (bytes[i + 2] & 0xc0) === 0x80) {
      const v = ((b & 0x0f) << 12) | ((bytes[i + 1] & 0x3f) << 6) | (bytes[i + 2] & 0x3f);
      if (v >= 0x800 && (v < 0xd800 || v > 0xdfff)) {
        c = v;
        n = 3;
      }
    } else if (
      b >= 0xf0 &&
      b < 0xf5 &&
      i + 3 < bytes.length &&
      (bytes[i + 1] & 0xc0) === 0x80 &&
      (bytes[i + 2] & 0xc0) === 0x80 &&
      (bytes[i + 3] & 0xc0) === 0x80
    ) {
      const v = ((b & 0x07) << 18) | ((bytes[i + 1] & 0x3f) << 12) | ((bytes[i + 2] & 0x3f) << 6) | (bytes[i + 3] & 0x3f);
      if (v >= 0x10000 && v <= 0x10ffff) {
        c = v;
        n = 4;
      }
    }
    out += String.fromCodePoint(c);
    i += n;
  }
  return out;
}

class Utf8Encoder {
  readonly encoding = "utf-8";
  encode(input = ""): Uint8Array {
    return utf8Encode(input);
  }
}

class Utf8Decoder {
  readonly encoding = "utf-8";
  constructor(label = "utf-8") {
    if (!/^utf-?8$/i.test(label)) throw new RangeError(`TextDecoder: only utf-8 is supported, not ${label}`);
  }
  decode(input?: Uint8Array): string {
    return input === undefined ? "" : utf8Decode(input);
  }
}

function percentDecode(s: string): string {
  const plus = s.replace(/\+/g, " ");
  try {
    return decodeURIComponent(plus);
  } catch {
    return plus;
  }
}

class QueryParams {
  readonly #pairs: Array<[string, string]> = [];
  constructor(init = "") {
    const q = init.startsWith("?") ? init.slice(1) : init;
    for (const part of q.split("&")) {
      if (part === "") continue;
      const eq = part.indexOf("=");
      const [k, v] = eq < 0 ? [part, ""] : [part.slice(0, eq), part.slice(eq + 1)];
      this.#pairs.push([percentDecode(k), percentDecode(v)]);
    }
  }
  get(name: string): string | null {
    return this.#pairs.find(([k]) => k === name)?.[1] ?? null;
  }
  getAll(name: string): string[] {
    return this.#pairs.filter(([k]) => k === name).map(([, v]) => v);
  }
  has(name: string): boolean {
    return this.#pairs.some(([k]) => k === name);
  }
  [Symbol.iterator](): IterableIterator<[string, string]> {
    return this.#pairs[Symbol.iterator]();
  }
}

const g = globalThis as Record<string, unknown>;
g.TextEncoder ??= Utf8Encoder;
g.TextDecoder ??= Utf8Decoder;
g.URLSearchParams ??= QueryParams;
