//! splitmix64's finaliser: a cheap, well-mixed bijection on `u64`, used
//! where the crate needs reproducible or collision-free numbers without a
//! random-number crate (session ids, chaos schedules), and the kernel's
//! own randomness where an id must never be made again.

/// Mixes `x`; distinct inputs give distinct outputs.
pub(crate) fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// 128 bits from the kernel, in hex: an id or a token that no process
/// makes again (a parked request's id, the web view's token).
#[cfg_attr(not(feature = "batch"), allow(dead_code))]
pub(crate) fn kernel_random_hex() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}
