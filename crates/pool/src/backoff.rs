//! Exponential back-off with a 1 ms floor, and jitter. (Being written.)
