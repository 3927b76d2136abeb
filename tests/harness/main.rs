//! The harness against a scripted provider: every rule of the seeds' turn.

mod finalizer;
mod gates;
mod helpers;
mod limits;
mod prompt;
mod thinking;
mod waves;
