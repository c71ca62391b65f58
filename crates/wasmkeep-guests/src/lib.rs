//! The repository's guest components, built from `examples/` for
//! wasm32-wasip2 by this crate's build script and embedded as bytes.
//!
//! Not a library for users: the CLI embeds [`DEMO`] for `serve --examples`,
//! and tests deploy these to a real runtime. No `.wasm` file is committed.

/// The bundled examples app (`demo/examples`): classes `counter`, `notes`,
/// `reminder`, `watch`.
pub const DEMO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/demo.wasm"));

/// Actors that misbehave on purpose (class `probe`), for tests.
pub const TESTBED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/testbed.wasm"));

/// The README's tour: one `counter` class in one file.
pub const HELLO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hello.wasm"));

/// A component that imports an interface no node provides (deploy tests).
pub const BAD_IMPORT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/bad_import.wasm"));

/// An actor that attacks the node running it (class `attacker`), for the
/// hostile-guest tests (issue 17).
pub const HOSTILE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hostile.wasm"));

/// The bundled examples in TypeScript (`demo/examples-ts`): classes
/// `chat`, `counter`, `pinger`, `reminder`, answering the routes of their
/// Rust namesakes. Built from `examples/ts` with `sdk/ts`.
pub const EXAMPLES_TS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/examples_ts.wasm"));

/// A TypeScript actor that attacks the node running it (class
/// `attacker`), for the hostile-guest tests in JavaScript.
pub const HOSTILE_TS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hostile_ts.wasm"));

/// Components written byte by byte, for what no Rust guest can be made to
/// be: shapes that stress the compiler or the instance pool.
pub mod forged {
    /// LEB128 of `n`.
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let b = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn section(id: u8, body: &[u8], out: &mut Vec<u8>) {
        out.push(id);
        leb(body.len(), out);
        out.extend_from_slice(body);
    }

    /// A component holding one core module (instantiated nowhere) with one
    /// function of `adds` additions: about 7 bytes each, and a compiler's
    /// memory grows with it (1,000,000 take about 700 MB to compile). It
    /// exports nothing, so a node refuses it after compiling it.
    pub fn one_long_function(adds: usize) -> Vec<u8> {
        // (func (param i32 i32) (result i32)
        //   local.get 0 local.get 1 i32.add local.set 0  ;; `adds` times
        //   local.get 0)
        let mut body = vec![0x00]; // no locals beyond the parameters
        for _ in 0..adds {
            body.extend_from_slice(&[0x20, 0, 0x20, 1, 0x6a, 0x21, 0]);
        }
        body.extend_from_slice(&[0x20, 0, 0x0b]);
        let mut code = vec![1];
        leb(body.len(), &mut code);
        code.extend_from_slice(&body);
        let mut module = b"\0asm\x01\0\0\0".to_vec();
        section(1, &[1, 0x60, 2, 0x7f, 0x7f, 1, 0x7f], &mut module);
        section(3, &[1, 0], &mut module);
        section(10, &code, &mut module);
        let mut component = b"\0asm\x0d\x00\x01\x00".to_vec();
        section(1, &module, &mut component);
        component
    }

    /// A component instantiating one core `module` `instances` times
    /// (each instance holds what the module defines).
    pub fn instantiating(module: &[u8], instances: usize) -> Vec<u8> {
        let mut component = b"\0asm\x0d\x00\x01\x00".to_vec();
        section(1, module, &mut component);
        let mut inst = Vec::new();
        leb(instances, &mut inst);
        for _ in 0..instances {
            // Instantiate module 0 with no arguments.
            inst.extend_from_slice(&[0x00, 0x00, 0x00]);
        }
        section(2, &inst, &mut component);
        component
    }

    /// `component` with a custom section naming `tag` appended: the same
    /// code under another hash, so a node compiles it afresh instead of
    /// loading it from a compile cache.
    pub fn renamed(component: &[u8], tag: &str) -> Vec<u8> {
        let mut custom = Vec::new();
        let name = b"wasmkeep-test";
        leb(name.len(), &mut custom);
        custom.extend_from_slice(name);
        custom.extend_from_slice(tag.as_bytes());
        let mut out = component.to_vec();
        section(0, &custom, &mut out);
        out
    }

    /// A module defining nothing.
    pub const EMPTY_MODULE: &[u8] = b"\0asm\x01\0\0\0";
    /// A module defining one memory of no pages.
    pub const MEMORY_MODULE: &[u8] = b"\0asm\x01\0\0\0\x05\x03\x01\x00\x00";
    /// A module defining one empty table of function references.
    pub const TABLE_MODULE: &[u8] = b"\0asm\x01\0\0\0\x04\x04\x01\x70\x00\x00";
}
