//! `PMI_process_mapping`: which node each rank runs on, as Hydra and Slurm
//! publish it: `(vector,(start,nodes,ranks_per_node),...)`. Each triple
//! places `ranks_per_node` consecutive ranks on each of `nodes` nodes from
//! `start`; the triples repeat until every rank is placed (a cyclic
//! distribution over 2 nodes is `(vector,(0,2,1))`).

/// Node index of every rank, in rank order; an error if `text` is malformed
/// or cannot describe a job of `size` ranks.
pub(crate) fn parse(text: &str, size: u32) -> Result<Vec<u32>, String> {
    let (nodes, triples, per_pass) = place(text, size)?;
    // A mapping smaller than the job repeats; one larger than the job must
    // end on a block boundary (it lists the nodes the job actually uses).
    if per_pass > u64::from(size) && !ends_on_block(&triples, size) {
        return Err(format!("PMI_process_mapping {text:?} does not match a job of {size} ranks"));
    }
    Ok(nodes)
}

/// [`parse`] for a mapping of places rather than ranks (Hydra's for a
/// spawned world): the ranks take the first `size` places, wherever the
/// last one falls in its block.
pub(crate) fn parse_first(text: &str, size: u32) -> Result<Vec<u32>, String> {
    place(text, size).map(|(nodes, _, _)| nodes)
}

/// The first `size` places of `text`, its triples and how many places one
/// pass of them holds.
#[allow(clippy::type_complexity)]
fn place(text: &str, size: u32) -> Result<(Vec<u32>, Vec<(u32, u32, u32)>, u64), String> {
    let triples = triples(text).ok_or_else(|| format!("PMI_process_mapping {text:?} is not (vector,(start,nodes,ranks),...)"))?;
    let per_pass: u64 = triples.iter().map(|&(_, n, r)| u64::from(n) * u64::from(r)).sum();
    if per_pass == 0 {
        return Err(format!("PMI_process_mapping {text:?} places no rank"));
    }
    if let Some(&(start, count, _)) = triples.iter().find(|&&(s, c, _)| s.checked_add(c).is_none()) {
        return Err(format!("PMI_process_mapping {text:?}: nodes {start} + {count} overflow the node numbers"));
    }
    let mut nodes = Vec::with_capacity(size as usize);
    'fill: loop {
        for &(start, count, ranks) in triples.iter().filter(|t| t.2 > 0) {
            for node in start..start + count {
                for _ in 0..ranks {
                    if nodes.len() == size as usize {
                        break 'fill;
                    }
                    nodes.push(node);
                }
            }
        }
    }
    Ok((nodes, triples, per_pass))
}

/// Whether some whole number of nodes of the first pass places exactly
/// `size` ranks (arithmetic, not a walk: counts may be huge).
fn ends_on_block(triples: &[(u32, u32, u32)], size: u32) -> bool {
    let mut placed = 0u64;
    for &(_, count, ranks) in triples {
        let (count, ranks) = (u64::from(count), u64::from(ranks));
        let left = u64::from(size) - placed.min(u64::from(size));
        if ranks > 0 && left % ranks == 0 && left / ranks <= count && left > 0 {
            return true;
        }
        placed = placed.saturating_add(count * ranks);
        if placed >= u64::from(size) {
            return false;
        }
    }
    false
}

fn triples(text: &str) -> Option<Vec<(u32, u32, u32)>> {
    let inner = text.trim().strip_prefix('(')?.strip_suffix(')')?;
    let rest = inner.strip_prefix("vector")?.trim_start_matches(',');
    let mut out = Vec::new();
    for part in rest.split(')') {
        let part = part.trim_start_matches(',').trim();
        if part.is_empty() {
            continue;
        }
        let nums: Vec<u32> = part.strip_prefix('(')?.split(',').map(|n| n.trim().parse().ok()).collect::<Option<_>>()?;
        let [s, n, r] = nums[..] else { return None };
        out.push((s, n, r));
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn block_cyclic_and_multi_triple_mappings() {
        assert_eq!(parse("(vector,(0,1,4))", 4).unwrap(), [0, 0, 0, 0]);
        assert_eq!(parse("(vector,(0,2,2))", 4).unwrap(), [0, 0, 1, 1]);
        assert_eq!(parse("(vector,(0,2,1))", 4).unwrap(), [0, 1, 0, 1]);
        assert_eq!(parse("(vector,(0,2,4),(2,1,3))", 11).unwrap(), [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2]);
        // Slurm writes a trailing block for uneven counts.
        assert_eq!(parse("(vector,(0,1,3),(1,1,2))", 5).unwrap(), [0, 0, 0, 1, 1]);
    }

    #[test]
    fn malformed_or_mismatched_mappings_are_errors() {
        assert!(parse("", 4).unwrap_err().contains("is not (vector"));
        assert!(parse("(vector,(0,1))", 4).is_err());
        assert!(parse("(vector,(0,0,0))", 4).unwrap_err().contains("no rank"));
        let e = parse("(vector,(0,2,4))", 5).unwrap_err();
        assert!(e.contains("does not match a job of 5 ranks"), "{e}");
    }

    #[test]
    fn a_spawned_worlds_mapping_of_places_gives_its_ranks_the_first_ones() {
        // Seen from Hydra 4.0.2: a world of 1 spawned onto node 1's 2 slots.
        assert_eq!(super::parse_first("(vector,(1,1,2))", 1).unwrap(), [1]);
        assert_eq!(super::parse_first("(vector,(0,2,2))", 3).unwrap(), [0, 0, 1]);
        assert!(parse("(vector,(1,1,2))", 1).is_err());
        assert!(super::parse_first("(vector,(0,0,0))", 1).is_err());
    }

    /// Item 17 of issue 15: a start index that overflows is an error, not a
    /// hang, and a huge node count is handled without walking it.
    #[test]
    fn item17_out_of_range_mappings_are_errors_without_a_hang() {
        let e = parse("(vector,(4294967295,2,1))", 4).unwrap_err();
        assert!(e.contains("overflow"), "{e}");
        // A triple with no ranks per node is skipped, whatever its node count.
        assert_eq!(parse("(vector,(0,4000000000,0),(0,1,2))", 2).unwrap(), [0, 0]);
        let t = std::time::Instant::now();
        assert!(parse("(vector,(0,4000000000,2))", 3).is_err(), "3 ranks cannot end a block of 2");
        assert!(t.elapsed().as_secs() < 1, "took {:?}", t.elapsed());
    }
}
