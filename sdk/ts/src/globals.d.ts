// The web globals an actor may use: QuickJS has none of them, and the
// SDK installs them (`web.ts`: UTF-8 only, and a URLSearchParams that
// reads a query). `fetch` is left out on purpose: a handler never waits on
// the network (use `outbox`).

declare class TextEncoder {
  encode(input?: string): Uint8Array;
}

declare class TextDecoder {
  constructor(label?: string, options?: { fatal?: boolean });
  decode(input?: Uint8Array): string;
}

declare class URLSearchParams {
  constructor(init?: string);
  get(name: string): string | null;
  getAll(name: string): string[];
  has(name: string): boolean;
  [Symbol.iterator](): IterableIterator<[string, string]>;
}
