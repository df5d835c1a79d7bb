//! Export the stack pointer, so the host can check that `gearbox_snapshot` left it where the
//! module starts it (the snapshot keeps the module's global as it is).
fn main() {
    println!("cargo:rustc-link-arg=--export=__stack_pointer");
}
