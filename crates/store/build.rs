//! Rebuilds when a migration is added or changed: `sqlx::migrate!` embeds
//! the migrations at compile time, and cargo does not otherwise watch them.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
