//! memzoo-data (work in progress).
