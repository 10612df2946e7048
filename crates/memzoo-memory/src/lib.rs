//! memzoo-memory (work in progress).
