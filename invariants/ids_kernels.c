/* RequestIds' hash -> slot map as an open-addressing hash table (built by
   invariants/compiled.py, wrapped by ids_kernels.py; the numpy levels of
   invariants/request_ids.py are the definition, and tests/test_compiled_ids.py holds
   every slot given here equal to theirs).

   Arrays, all owned (allocated and grown) by Python:
     table   int64 [cap]   cap a power of two, mask = cap - 1; -1 empty, else
                           (tag << SLOT_BITS) | slot, tag the top TAG_BITS of the mixed
                           hash (a probe reads hashes[slot] only when the tags agree)
     hashes  int64 [hcap]  the hash (ids_hash) of the id of each slot the table holds
     data    uint8 [dcap]  every id's UTF-8 bytes, in slot order
     offsets int64 [ocap]  id q is data[offsets[q]:offsets[q + 1]]
   A batch of L ids: blob uint8 (their bytes), off int64 [L+1], h int64 [L] (their
   hashes, ids_hash: of the bytes, so no Python str is made for an id the table serves).
   Linear probing from mix(h) & mask; an entry is never removed. One slot per hash: an
   id whose hash the table already holds for another id (a collision, its bytes differ)
   is left to Python (request_ids.py keeps those in a dict, as numpy does). */
#include <stdint.h>
#include <string.h>

typedef int64_t i64;
typedef uint64_t u64;
typedef uint8_t u8;

#define SLOT_BITS 40
#define SLOT_MASK ((((i64)1) << SLOT_BITS) - 1)
#define TAG_BITS 23   /* 63 - SLOT_BITS: an entry is >= 0 */

static inline u64 mix(i64 h)
{
    u64 x = (u64)h;
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x;
}

static inline i64 tag_of(u64 m) { return (i64)(m >> (64 - TAG_BITS)); }

/* h [L] = a 64-bit hash of each id's bytes (blob/off): 8 bytes at a time, each word
   mixed into the state (fmix64, the length folded in), the last 0-7 bytes as one word.
   Any fixed function of the bytes serves: equal ids hash alike, and a collision costs only
   a trip to Python (an id whose hash another id holds). */
static inline u64 word(const u8 *p, i64 n)
{
    u64 w = 0;
    memcpy(&w, p, (size_t)n);
    return w;
}

void ids_hash(i64 L, const u8 *blob, const i64 *off, i64 *h)
{
    for (i64 i = 0; i < L; i++) {
        const u8 *p = blob + off[i];
        i64 n = off[i + 1] - off[i];
        u64 x = 0x9E3779B97F4A7C15ull ^ ((u64)n * 0xC2B2AE3D27D4EB4Full);
        for (; n >= 8; p += 8, n -= 8)
            x = (x ^ mix((i64)word(p, 8))) * 0x9FB21C651E98DF25ull;
        x = (x ^ mix((i64)(word(p, n) ^ ((u64)n << 59)))) * 0x9FB21C651E98DF25ull;
        h[i] = (i64)mix((i64)x);
    }
}

/* the table position holding hash hv, or of the empty entry where it would go */
static inline i64 probe(const i64 *table, i64 mask, const i64 *hashes, i64 hv)
{
    u64 m = mix(hv);
    i64 tag = tag_of(m), p = (i64)(m & (u64)mask);
    for (;;) {
        i64 e = table[p];
        if (e < 0 || ((e >> SLOT_BITS) == tag && hashes[e & SLOT_MASK] == hv))
            return p;
        p = (p + 1) & mask;
    }
}

static inline i64 entry(i64 hv, i64 slot) { return (tag_of(mix(hv)) << SLOT_BITS) | slot; }

/* batch id i (blob/off) byte-equal to stored id q (data/offsets)? */
static inline int same_bytes(const u8 *blob, const i64 *off, i64 i, const u8 *data, const i64 *offsets, i64 q)
{
    i64 len = off[i + 1] - off[i];
    return len == offsets[q + 1] - offsets[q] && memcmp(blob + off[i], data + offsets[q], (size_t)len) == 0;
}

/* k (hash, slot) pairs h, s [k] whose hashes are distinct and not in the table: inserted,
   hashes[s] = h (the levels of a numpy RequestIds, taken over) */
void ids_insert(i64 k, const i64 *h, const i64 *s, i64 *table, i64 mask, i64 *hashes)
{
    for (i64 j = 0; j < k; j++) {
        hashes[s[j]] = h[j];
        table[probe(table, mask, hashes, h[j])] = entry(h[j], s[j]);
    }
}

/* every entry of old [old_cap] into table (empty, mask + 1 entries) */
void ids_rehash(i64 old_cap, const i64 *old, i64 *table, i64 mask, const i64 *hashes)
{
    for (i64 p = 0; p < old_cap; p++) {
        i64 e = old[p];
        if (e < 0)
            continue;
        u64 m = mix(hashes[e & SLOT_MASK]);
        i64 q = (i64)(m & (u64)mask);
        while (table[q] >= 0)
            q = (q + 1) & mask;
        table[q] = e;
    }
}

/* Lookups only: out [L] = the slot of each id, -1 when the table has not its hash, or
   -2 - owner when it has, for another id (slot owner: bytes differ). */
void ids_lookup(i64 L, const u8 *blob, const i64 *off, const i64 *h, const i64 *table, i64 mask,
                const i64 *hashes, const u8 *data, const i64 *offsets, i64 *out)
{
    for (i64 i = 0; i < L; i++) {
        i64 e = table[probe(table, mask, hashes, h[i])];
        if (e < 0) {
            out[i] = -1;
            continue;
        }
        i64 q = e & SLOT_MASK;
        out[i] = same_bytes(blob, off, i, data, offsets, q) ? q : -2 - q;
    }
}

/* Rows i0, i0 + 1, ... of a batch in order: a known id -> its slot; an id whose hash the
   table lacks -> the next slot state[0] (its bytes appended to data/offsets, the table
   entry added: new ids in order of first appearance); a hash held by another id -> -2 -
   owner (left to Python). state [2]: slots used (n), table entries used; limit: the most
   entries the table may hold. Returns L when done, else the row that found no room (a
   new id, not yet added: Python grows the arrays and calls again from it). */
i64 ids_index(i64 L, i64 i0, const u8 *blob, const i64 *off, const i64 *h, i64 *table, i64 mask,
              i64 limit, i64 *hashes, i64 hcap, u8 *data, i64 dcap, i64 *offsets, i64 ocap,
              i64 *out, i64 *state)
{
    i64 n = state[0], used = state[1];
    for (i64 i = i0; i < L; i++) {
        i64 p = probe(table, mask, hashes, h[i]), e = table[p];
        if (e >= 0) {
            i64 q = e & SLOT_MASK;
            out[i] = same_bytes(blob, off, i, data, offsets, q) ? q : -2 - q;
            continue;
        }
        i64 len = off[i + 1] - off[i], end = offsets[n];
        if (used + 1 > limit || n + 1 > hcap || n + 2 > ocap || end + len > dcap) {
            state[0] = n;
            state[1] = used;
            return i;
        }
        memcpy(data + end, blob + off[i], (size_t)len);
        offsets[n + 1] = end + len;
        hashes[n] = h[i];
        table[p] = entry(h[i], n);
        out[i] = n++;
        used++;
    }
    state[0] = n;
    state[1] = used;
    return L;
}
