//! Server-requested delays. (Being written.)
