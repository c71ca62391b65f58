//! Imports `acme:nope/thing`, which no wasmkeep node provides, and exports
//! nothing wasmkeep expects: a deploy must refuse it with a clear error.

wit_bindgen::generate!({ path: "wit", world: "bad" });

struct Bad;

impl Guest for Bad {
    fn run() -> u32 {
        acme::nope::thing::poke()
    }
}

export!(Bad);
