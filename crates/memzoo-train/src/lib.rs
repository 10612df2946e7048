//! memzoo-train (work in progress).
