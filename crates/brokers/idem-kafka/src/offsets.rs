//! Which offset of a partition may be committed: the one after the longest
//! run of finished messages from the start. A slow message holds its
//! partition's commit back; a later one finishing never lets the commit
//! pass it.

use std::collections::VecDeque;

/// Where a handed-out message stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    /// With the runner: a revoke waits for it.
    InWork,
    /// Nobody works on it (handed back, or its copy waits to be written):
    /// it holds the commit back, but a revoke or close does not wait for
    /// it.
    Abandoned,
    Finished,
}

/// The messages of one partition handed out and not yet committable.
#[derive(Debug, Default)]
pub(crate) struct Offsets {
    /// Handed out, in offset order, each with where it stands.
    pending: VecDeque<(i64, Status)>,
    /// The next offset to commit: every message below it is finished.
    next: Option<i64>,
    /// What was last committed (or found committed).
    committed: Option<i64>,
}

impl Offsets {
    /// A message at `offset` was handed out. Offsets come in increasing
    /// order; one not above the last is ignored (a redelivery after a seek
    /// is tracked by its first entry).
    pub(crate) fn delivered(&mut self, offset: i64) -> bool {
        if self.pending.back().is_some_and(|&(last, _)| last >= offset)
            || self.next.is_some_and(|next| offset < next)
        {
            return false;
        }
        self.pending.push_back((offset, Status::InWork));
        true
    }

    /// The message at `offset` is finished (acked, copied to a retry topic
    /// or dead-lettered). Returns whether it was being tracked.
    pub(crate) fn finished(&mut self, offset: i64) -> bool {
        let Ok(i) = self.pending.binary_search_by_key(&offset, |&(o, _)| o) else {
            return false;
        };
        self.pending[i].1 = Status::Finished;
        while let Some(&(o, Status::Finished)) = self.pending.front() {
            self.pending.pop_front();
            self.next = Some(o + 1);
        }
        true
    }

    /// Nobody works on the message at `offset` any more, and it is not
    /// finished: the commit stays before it, and nothing waits for it.
    pub(crate) fn abandoned(&mut self, offset: i64) {
        self.set_unfinished(offset, Status::Abandoned);
    }

    /// The message at `offset` is in work again (put back in the buffer).
    pub(crate) fn in_work(&mut self, offset: i64) {
        self.set_unfinished(offset, Status::InWork);
    }

    fn set_unfinished(&mut self, offset: i64, status: Status) {
        if let Ok(i) = self.pending.binary_search_by_key(&offset, |&(o, _)| o)
            && self.pending[i].1 != Status::Finished
        {
            self.pending[i].1 = status;
        }
    }

    /// Forgets the handed-out messages from `offset` on (taken back before
    /// anyone worked on them).
    pub(crate) fn forget_from(&mut self, offset: i64) {
        while self.pending.back().is_some_and(|&(o, _)| o >= offset) {
            self.pending.pop_back();
        }
    }

    /// The offset to commit, if it moved since the last commit.
    pub(crate) fn to_commit(&self) -> Option<i64> {
        self.next.filter(|&next| Some(next) != self.committed)
    }

    /// `offset` was committed.
    pub(crate) fn committed(&mut self, offset: i64) {
        self.committed = Some(offset);
    }

    /// The last commit did not go through: commit again.
    pub(crate) fn uncommitted(&mut self) {
        self.committed = None;
    }

    /// Messages handed out, in work and not finished (abandoned ones are
    /// not counted: nothing will finish them).
    pub(crate) fn unfinished(&self) -> usize {
        self.pending
            .iter()
            .filter(|&&(_, status)| status == Status::InWork)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_slow_message_holds_the_commit_back() {
        let mut o = Offsets::default();
        for offset in 10..15 {
            assert!(o.delivered(offset));
        }
        for offset in [11, 12, 14] {
            o.finished(offset);
        }
        assert_eq!(o.to_commit(), None, "10 is not finished");
        o.finished(10);
        assert_eq!(o.to_commit(), Some(13), "13 is not finished");
        o.committed(13);
        assert_eq!(o.to_commit(), None);
        o.finished(13);
        assert_eq!(o.to_commit(), Some(15));
        assert_eq!(o.unfinished(), 0);
    }

    #[test]
    fn gaps_in_offsets_are_no_holes() {
        // Compacted topics and transaction markers leave gaps.
        let mut o = Offsets::default();
        for offset in [3, 7, 8] {
            o.delivered(offset);
        }
        o.finished(8);
        o.finished(3);
        assert_eq!(o.to_commit(), Some(4));
        o.finished(7);
        assert_eq!(o.to_commit(), Some(9));
    }

    #[test]
    fn taken_back_messages_are_forgotten() {
        let mut o = Offsets::default();
        for offset in 0..6 {
            o.delivered(offset);
        }
        o.finished(0);
        o.forget_from(3);
        assert_eq!(o.unfinished(), 2);
        assert!(o.delivered(3), "redelivered after the seek");
        assert!(!o.delivered(2), "not above the last");
    }

    #[test]
    fn an_abandoned_message_holds_the_commit_but_is_not_waited_for() {
        let mut o = Offsets::default();
        for offset in 0..3 {
            o.delivered(offset);
        }
        o.abandoned(1);
        o.finished(0);
        o.finished(2);
        assert_eq!(o.unfinished(), 0, "nothing in work");
        assert_eq!(o.to_commit(), Some(1), "the commit stays before 1");
        o.in_work(1);
        assert_eq!(o.unfinished(), 1);
        o.finished(1);
        assert_eq!(o.to_commit(), Some(3));
    }

    proptest! {
        /// Whatever order messages finish in, the commit is always the end
        /// of the finished prefix: never past an unfinished message.
        #[test]
        fn the_commit_never_passes_an_unfinished_message(
            order in Just((0..40i64).collect::<Vec<_>>()).prop_shuffle(),
            done in 0usize..40,
        ) {
            let mut o = Offsets::default();
            for offset in 0..40 {
                o.delivered(offset * 2);
            }
            let finished: Vec<i64> = order[..done].iter().map(|i| i * 2).collect();
            for &f in &finished {
                o.finished(f);
            }
            let prefix = (0..40).map(|i| i * 2).take_while(|x| finished.contains(x)).count() as i64;
            let expected = (prefix > 0).then(|| (prefix - 1) * 2 + 1);
            prop_assert_eq!(o.to_commit(), expected);
            prop_assert_eq!(o.unfinished(), 40 - done);
        }
    }
}
