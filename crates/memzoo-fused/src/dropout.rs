//! Seeded inverted-dropout masks drawn on the host: the one generator every replayable mask in
//! memzoo comes from (`memzoo_reformer::rng::dropout_mask`, relative and kNN attention with a
//! dropout seed). It lives here for the optimisation level: drawing a mask is a loop over every
//! element of an activation, a hot loop in every training step with dropout.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use rayon::prelude::*;

/// Elements drawn per task.
const CHUNK: usize = 1 << 15;

/// `n` values of an inverted-dropout mask drawn from `seed`: element `i` is `0` where the
/// `i`-th uniform draw `u_i ∈ [0, 1)` of `StdRng::seed_from_u64(seed)` is below `p`, else
/// `1 / (1 - p)`. The same `(n, p, seed)` give the same mask on every machine and thread.
///
/// Drawn in parallel: `StdRng` is ChaCha12, whose stream can start at any word; draw `i`
/// reads the stream's 32-bit words `2i` and `2i + 1` (one `u64`), so each chunk of elements
/// starts its own copy of the generator at its first element's word, and the mask is the one
/// the sequential loop draws. Where the CPU has AVX-512 F and BMI2 (or AVX2 and BMI2), the
/// stream's blocks are computed here, sixteen (eight) at a time, and compared without leaving
/// the registers (`rand_chacha` computes four at a time, and each draw went through its
/// buffer): the same words. Dropout took 15% of an XL-small step on the Zen 5 with
/// `rand_chacha`, 6% with the AVX2 loop, 2-3% with the AVX-512 one.
pub fn mask_values(n: usize, p: f64, seed: u64) -> Vec<f32> {
    Drawer::fastest(p, seed).mask(n)
}

/// [`mask_values`] with AVX2 and BMI2 (8 ChaCha12 blocks at a time), where the CPU has them,
/// else `rand_chacha`'s: the same mask.
pub fn mask_values_avx2(n: usize, p: f64, seed: u64) -> Vec<f32> {
    Drawer::avx2(p, seed).mask(n)
}

/// [`mask_values`] with `rand_chacha`'s generator on any CPU: the same mask.
pub fn mask_values_portable(n: usize, p: f64, seed: u64) -> Vec<f32> {
    Drawer::portable(p, seed).mask(n)
}

/// [`mask_values`] packed into bits: bit `i % 32` of word `i / 32` is 1 where element `i` is
/// kept (`1 / (1 - p)`), 0 where it is dropped; the last word's bits past `n` are 0. The form
/// a device uploads: 32 times fewer bytes than the `f32` mask, which the device rebuilds as
/// `bit · 1 / (1 - p)` (`memzoo_reformer::rng::dropout_mask`).
pub fn keep_words(n: usize, p: f64, seed: u64) -> Vec<u32> {
    let drawer = Drawer::fastest(p, seed);
    let mut words = vec![0u32; n.div_ceil(32)];
    words
        .par_chunks_mut(CHUNK / 32)
        .enumerate()
        .for_each(|(c, words)| {
            let mut values = vec![0f32; (n - c * CHUNK).min(CHUNK)];
            drawer.fill(c, &mut values);
            for (word, values) in words.iter_mut().zip(values.chunks(32)) {
                *word = values
                    .iter()
                    .enumerate()
                    .fold(0, |w, (b, &v)| w | (u32::from(v != 0.0) << b));
            }
        });
    words
}

/// A SIMD kernel's mask of one chunk: `(key, first block, limit, keep, out)`.
#[cfg(target_arch = "x86_64")]
type Kernel = unsafe fn(&[u32; 8], u64, u64, f32, &mut [f32]);

/// How the chunks of one mask are drawn: a SIMD kernel of this CPU, or `rand_chacha`'s
/// generator (the same values).
enum Drawer {
    /// Element `i` reads the stream's words `2i` and `2i + 1`; a kernel starts at a chunk's
    /// first block from the key alone.
    #[cfg(target_arch = "x86_64")]
    Simd {
        kernel: Kernel,
        key: [u32; 8],
        limit: u64,
        keep: f32,
    },
    /// A copy of the generator set to each chunk's first word.
    Portable {
        start: Box<ChaCha12Rng>,
        threshold: u64,
        keep: f32,
    },
}

impl Drawer {
    /// AVX-512 F and BMI2 where the CPU has them, else [`Drawer::avx2`].
    fn fastest(p: f64, seed: u64) -> Self {
        #[cfg(target_arch = "x86_64")]
        if memzoo_backend::simd::avx512()
            && let Some(drawer) = Self::simd(p, seed, avx512::mask)
        {
            return drawer;
        }
        Self::avx2(p, seed)
    }

    /// AVX2 and BMI2 where the CPU has them, else [`Drawer::portable`].
    fn avx2(p: f64, seed: u64) -> Self {
        #[cfg(target_arch = "x86_64")]
        if memzoo_backend::simd::avx2()
            && let Some(drawer) = Self::simd(p, seed, avx2::mask)
        {
            return drawer;
        }
        Self::portable(p, seed)
    }

    /// `kernel`'s drawer; `None` where `p >= 1` (every element dropped: the portable path's).
    /// Only for a kernel whose features the CPU has (the callers check).
    #[cfg(target_arch = "x86_64")]
    fn simd(p: f64, seed: u64, kernel: Kernel) -> Option<Self> {
        let (keep, threshold) = keep_and_threshold(p);
        (threshold < 1 << 53).then(|| Drawer::Simd {
            kernel,
            key: key_words(seed),
            limit: threshold << 11,
            keep,
        })
    }

    fn portable(p: f64, seed: u64) -> Self {
        let (keep, threshold) = keep_and_threshold(p);
        Drawer::Portable {
            start: Box::new(ChaCha12Rng::seed_from_u64(seed)),
            threshold,
            keep,
        }
    }

    /// The `n` values, chunks in parallel.
    fn mask(&self, n: usize) -> Vec<f32> {
        let mut mask = vec![0f32; n];
        mask.par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(c, chunk)| self.fill(c, chunk));
        mask
    }

    /// Chunk `c` of the mask (elements from `c · CHUNK` on) into `out`.
    fn fill(&self, c: usize, out: &mut [f32]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Drawer::Simd {
                kernel,
                key,
                limit,
                keep,
            } => {
                // Element i reads words 2i and 2i + 1: block 2i / 16.
                let first_block = (2 * c * CHUNK / 16) as u64;
                // SAFETY: a `Simd` drawer holds a kernel whose features the CPU has.
                unsafe { kernel(key, first_block, *limit, *keep, out) };
            }
            Drawer::Portable {
                start,
                threshold,
                keep,
            } => {
                let mut rng = ChaCha12Rng::clone(start);
                rng.set_word_pos(2 * (c * CHUNK) as u128);
                // The draws a block at a time (`fill` reads the stream's words in order, two
                // per `u64`, as `next_u64` does), then a branch-free loop over them.
                let mut words = [0u64; 512];
                for block in out.chunks_mut(words.len()) {
                    let words = &mut words[..block.len()];
                    rng.fill(words);
                    for (m, &x) in block.iter_mut().zip(words.iter()) {
                        *m = if (x >> 11) < *threshold { 0.0 } else { *keep };
                    }
                }
            }
        }
    }
}

/// The ChaCha12 key of `StdRng::seed_from_u64(seed)`, as 8 little-endian words.
#[cfg(target_arch = "x86_64")]
fn key_words(seed: u64) -> [u32; 8] {
    let seed = ChaCha12Rng::seed_from_u64(seed).get_seed();
    std::array::from_fn(|i| {
        u32::from_le_bytes([
            seed[4 * i],
            seed[4 * i + 1],
            seed[4 * i + 2],
            seed[4 * i + 3],
        ])
    })
}

/// The keep value `1 / (1 - p)` and the drop threshold: `random::<f64>()` is
/// `u = (x >> 11) 2^-53` of the next `u64` `x`; `2^53 p` is exact in f64, so `u < p` exactly
/// when the integer `x >> 11` is below `ceil(2^53 p)` (a NaN `p` gives 0: nothing dropped, as
/// no `u < NaN` holds).
fn keep_and_threshold(p: f64) -> (f32, u64) {
    (
        (1.0 / (1.0 - p)) as f32,
        (p * (1u64 << 53) as f64).ceil() as u64,
    )
}

/// ChaCha12's rounds on the state `x` (16 words, each a register of blocks): six double
/// rounds, each the four column quarter rounds then the four diagonal ones.
#[cfg(target_arch = "x86_64")]
macro_rules! chacha12_rounds {
    ($x:ident, $quarter:ident) => {
        for _ in 0..6 {
            $quarter(&mut $x, 0, 4, 8, 12);
            $quarter(&mut $x, 1, 5, 9, 13);
            $quarter(&mut $x, 2, 6, 10, 14);
            $quarter(&mut $x, 3, 7, 11, 15);
            $quarter(&mut $x, 0, 5, 10, 15);
            $quarter(&mut $x, 1, 6, 11, 12);
            $quarter(&mut $x, 2, 7, 8, 13);
            $quarter(&mut $x, 3, 4, 9, 14);
        }
    };
}

/// The masks with AVX-512: sixteen ChaCha12 blocks at once, lane `j` of register `w` holding
/// word `w` of block `j`, the same stream as `rand_chacha`'s (the RFC's state: constants, the
/// 8 key words, a 64-bit block counter in words 12-13, the stream number, 0, in 14-15).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// `a += b; d ^= a; d <<<= 16; c += d; b ^= c; b <<<= 12; a += b; d ^= a; d <<<= 8;
    /// c += d; b ^= c; b <<<= 7` (the ChaCha quarter round) on 16 blocks at once.
    #[inline(always)]
    fn quarter(x: &mut [__m512i; 16], a: usize, b: usize, c: usize, d: usize) {
        // SAFETY: AVX-512 F, as the callers' (`mask`).
        unsafe {
            x[a] = _mm512_add_epi32(x[a], x[b]);
            x[d] = _mm512_rol_epi32::<16>(_mm512_xor_si512(x[d], x[a]));
            x[c] = _mm512_add_epi32(x[c], x[d]);
            x[b] = _mm512_rol_epi32::<12>(_mm512_xor_si512(x[b], x[c]));
            x[a] = _mm512_add_epi32(x[a], x[b]);
            x[d] = _mm512_rol_epi32::<8>(_mm512_xor_si512(x[d], x[a]));
            x[c] = _mm512_add_epi32(x[c], x[d]);
            x[b] = _mm512_rol_epi32::<7>(_mm512_xor_si512(x[b], x[c]));
        }
    }

    /// `out[i]` for the elements of the stream from block `first_block` on (element `i` reads
    /// words `2i` and `2i + 1` from there): `0` where the `u64` of those words (the first one
    /// low) is below `limit` (`ceil(2^53 p) 2^11`: its top 53 bits below `2^53 p`), else `keep`.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BMI2.
    #[target_feature(enable = "avx512f,bmi2")]
    pub unsafe fn mask(key: &[u32; 8], first_block: u64, limit: u64, keep: f32, out: &mut [f32]) {
        const SIGMA: [u32; 4] = [0x6170_7865, 0x3320_646e, 0x7962_2d32, 0x6b20_6574];
        let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let (limit_lo, limit_hi) = (
            _mm512_set1_epi32(limit as i32),
            _mm512_set1_epi32((limit >> 32) as i32),
        );
        let (kept, dropped) = (_mm512_set1_ps(keep), _mm512_setzero_ps());
        let mut block = first_block;
        // 16 blocks: 256 words, 128 elements.
        for batch in out.chunks_mut(128) {
            let base = _mm512_set1_epi32(block as i32);
            let counter_lo = _mm512_add_epi32(base, lanes);
            // A lane whose low word wrapped carries into the high one.
            let wrapped = _mm512_cmplt_epu32_mask(counter_lo, base);
            let high = _mm512_set1_epi32((block >> 32) as i32);
            let counter_hi = _mm512_mask_add_epi32(high, wrapped, high, _mm512_set1_epi32(1));
            let init: [__m512i; 16] = std::array::from_fn(|w| match w {
                0..4 => _mm512_set1_epi32(SIGMA[w] as i32),
                4..12 => _mm512_set1_epi32(key[w - 4] as i32),
                12 => counter_lo,
                13 => counter_hi,
                _ => _mm512_setzero_si512(),
            });
            let mut x = init;
            chacha12_rounds!(x, quarter);
            for w in 0..16 {
                x[w] = _mm512_add_epi32(x[w], init[w]);
            }
            // Element 8 j + p of the batch reads words 2p (low) and 2p + 1 of block j: bit
            // 8 j + p of `drop` (two u64s) from bit j of pair p's mask.
            let mut drop = [0u64; 2];
            for p in 0..8 {
                let (lo, hi) = (x[2 * p], x[2 * p + 1]);
                let below = _mm512_cmplt_epu32_mask(hi, limit_hi)
                    | (_mm512_cmpeq_epi32_mask(hi, limit_hi)
                        & _mm512_cmplt_epu32_mask(lo, limit_lo));
                let spread = 0x0101_0101_0101_0101u64 << p;
                drop[0] |= _pdep_u64(below as u64 & 0xff, spread);
                drop[1] |= _pdep_u64((below >> 8) as u64, spread);
            }
            for (c, values) in batch.chunks_mut(16).enumerate() {
                let m = (drop[c / 4] >> (16 * (c % 4))) as u16;
                let v = _mm512_mask_blend_ps(m, kept, dropped);
                let tail = if values.len() == 16 {
                    u16::MAX
                } else {
                    (1u16 << values.len()) - 1
                };
                // SAFETY: the mask writes only the `values.len()` floats of `values`.
                unsafe { _mm512_mask_storeu_ps(values.as_mut_ptr(), tail, v) };
            }
            block = block.wrapping_add(16);
        }
    }
}

/// The masks with AVX2: [`avx512`]'s loop on eight ChaCha12 blocks at once.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// `x <<< n` on every 32-bit lane.
    #[inline(always)]
    fn rotate<const L: i32, const R: i32>(x: __m256i) -> __m256i {
        // SAFETY: AVX2, as the callers' (`mask`).
        unsafe { _mm256_or_si256(_mm256_slli_epi32::<L>(x), _mm256_srli_epi32::<R>(x)) }
    }

    /// The ChaCha quarter round on 8 blocks at once (rotations by 16 and 8 as byte shuffles).
    #[inline(always)]
    fn quarter(x: &mut [__m256i; 16], a: usize, b: usize, c: usize, d: usize) {
        // SAFETY: AVX2, as the callers' (`mask`).
        unsafe {
            let r16 = _mm256_setr_epi8(
                2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13, 2, 3, 0, 1, 6, 7, 4, 5, 10,
                11, 8, 9, 14, 15, 12, 13,
            );
            let r8 = _mm256_setr_epi8(
                3, 0, 1, 2, 7, 4, 5, 6, 11, 8, 9, 10, 15, 12, 13, 14, 3, 0, 1, 2, 7, 4, 5, 6, 11,
                8, 9, 10, 15, 12, 13, 14,
            );
            x[a] = _mm256_add_epi32(x[a], x[b]);
            x[d] = _mm256_shuffle_epi8(_mm256_xor_si256(x[d], x[a]), r16);
            x[c] = _mm256_add_epi32(x[c], x[d]);
            x[b] = rotate::<12, 20>(_mm256_xor_si256(x[b], x[c]));
            x[a] = _mm256_add_epi32(x[a], x[b]);
            x[d] = _mm256_shuffle_epi8(_mm256_xor_si256(x[d], x[a]), r8);
            x[c] = _mm256_add_epi32(x[c], x[d]);
            x[b] = rotate::<7, 25>(_mm256_xor_si256(x[b], x[c]));
        }
    }

    /// [`super::avx512::mask`] with AVX2: 8 blocks, 64 elements at a time.
    ///
    /// # Safety
    /// The CPU must have AVX2 and BMI2.
    #[target_feature(enable = "avx2,bmi2")]
    pub unsafe fn mask(key: &[u32; 8], first_block: u64, limit: u64, keep: f32, out: &mut [f32]) {
        const SIGMA: [u32; 4] = [0x6170_7865, 0x3320_646e, 0x7962_2d32, 0x6b20_6574];
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        // Unsigned compares as signed ones of values with the top bit flipped.
        let flip = _mm256_set1_epi32(i32::MIN);
        let signed = |v: __m256i| _mm256_xor_si256(v, flip);
        let limit_lo = signed(_mm256_set1_epi32(limit as i32));
        let limit_hi = signed(_mm256_set1_epi32((limit >> 32) as i32));
        let mut block = first_block;
        for batch in out.chunks_mut(64) {
            let base = _mm256_set1_epi32(block as i32);
            let counter_lo = _mm256_add_epi32(base, lanes);
            // A lane whose low word wrapped (is below the base, unsigned) carries.
            let wrapped = _mm256_cmpgt_epi32(signed(base), signed(counter_lo));
            let counter_hi = _mm256_sub_epi32(_mm256_set1_epi32((block >> 32) as i32), wrapped);
            let init: [__m256i; 16] = std::array::from_fn(|w| match w {
                0..4 => _mm256_set1_epi32(SIGMA[w] as i32),
                4..12 => _mm256_set1_epi32(key[w - 4] as i32),
                12 => counter_lo,
                13 => counter_hi,
                _ => _mm256_setzero_si256(),
            });
            let mut x = init;
            chacha12_rounds!(x, quarter);
            for w in 0..16 {
                x[w] = _mm256_add_epi32(x[w], init[w]);
            }
            // Element 8 j + p reads words 2p and 2p + 1 of block j: bit 8 j + p of `drop`.
            let mut drop = 0u64;
            for p in 0..8 {
                let (lo, hi) = (signed(x[2 * p]), signed(x[2 * p + 1]));
                let below = _mm256_or_si256(
                    _mm256_cmpgt_epi32(limit_hi, hi),
                    _mm256_and_si256(
                        _mm256_cmpeq_epi32(hi, limit_hi),
                        _mm256_cmpgt_epi32(limit_lo, lo),
                    ),
                );
                let bits = _mm256_movemask_ps(_mm256_castsi256_ps(below)) as u64;
                drop |= _pdep_u64(bits, 0x0101_0101_0101_0101u64 << p);
            }
            for (c, values) in batch.chunks_mut(8).enumerate() {
                let m = (drop >> (8 * c)) as u8;
                for (i, v) in values.iter_mut().enumerate() {
                    *v = if (m >> i) & 1 == 1 { 0.0 } else { keep };
                }
            }
            block = block.wrapping_add(8);
        }
    }
}
