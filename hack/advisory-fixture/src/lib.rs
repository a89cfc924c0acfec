//! Never built: cargo deny reads this crate's dependency graph only.
