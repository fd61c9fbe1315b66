//! Rebuilds the server when a migration changes or is added: refinery
//! embeds `migrations/` at compile time, and cargo does not know to look
//! there.

fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
