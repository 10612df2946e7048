//! memzoo-knn (work in progress).
