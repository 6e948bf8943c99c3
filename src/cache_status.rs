//! How a caller was served: the vocabulary the coalescer decides, the
//! response headers show (`x-corral-cache`, `Cache-Status`) and the metrics
//! count. A leaf, so the metrics sink need not know the coalescer.

/// How a caller was served; becomes `x-corral-cache` and `Cache-Status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheStatus {
    Hit,
    Stale,
    Miss,
    Coalesced,
    Bypass,
}

impl CacheStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hit => "HIT",
            Self::Stale => "STALE",
            Self::Miss => "MISS",
            Self::Coalesced => "COALESCED",
            Self::Bypass => "BYPASS",
        }
    }
}
