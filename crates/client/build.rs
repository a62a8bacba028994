//! Generates `include/gepsea.h` from the C ABI in `src/capi.rs` (cbindgen), so the
//! header can never drift from the library.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    println!("cargo:rerun-if-changed=src/capi.rs");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let cfg = cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).expect("cbindgen.toml");
    let header = std::path::Path::new(&dir).join("../../include/gepsea.h");
    cbindgen::Builder::new().with_crate(&dir).with_config(cfg).generate().expect("generating the C header").write_to_file(header);
}
