// The web globals an actor may use: the component's JavaScript engine
// (SpiderMonkey in StarlingMonkey) provides them. `fetch` is left out on
// purpose: a handler never waits on the network (use `outbox`).

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
