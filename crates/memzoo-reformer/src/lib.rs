//! memzoo-reformer (work in progress).
