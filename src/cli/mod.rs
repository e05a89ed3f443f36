//! Subcommands of the `flash-attn` tool.

pub mod ledger;
