//! What each allocation is for, in the categories of PyTorch's memory profiler
//! (`torch.profiler._memory_profiler.Category`): parameters, their gradients, optimizer
//! state, inputs, activations saved for backward, temporaries, and everything else;
//! plus one of our own, the autocast cache (see `tensor/autocast.rs`).
//!
//! PyTorch works the categories out after the fact, from a profile of the tensors' uses.
//! Here an allocation gets one when it is made, from the innermost [`CategoryScope`] of
//! the thread (a module builds its parameters inside `Category::Parameter`, an
//! optimizer its state inside `Category::OptimizerState`), and changes it when its role
//! changes: autograd marks the tensors it saves as activations and the gradients it
//! stores in `.grad` as gradients. The allocator keeps one statistic per category, so a
//! training step can be broken down while it runs.
//!
//! Reading the scope is one thread-local load; the statistic is one more add under
//! the lock the allocator already holds.

use std::cell::Cell;
use std::fmt;

// ANCHOR: category
/// What an allocation holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    /// A module's weights.
    Parameter,
    /// A parameter's accumulated gradient (`.grad`).
    Gradient,
    /// An optimizer's per-parameter state (Adam's moments, SGD's momentum).
    OptimizerState,
    /// A batch handed to the model.
    Input,
    /// A tensor autograd saved for the backward pass.
    Activation,
    /// Any other tensor an op made: an output not saved, a gradient on its way.
    Temporary,
    /// Memory not made through a tensor (raw allocator use, replays).
    Other,
    /// Half-precision copies of float32 weights that autocast keeps for the rest of its
    /// region (PyTorch's autocast cache), and after it for as long as a graph saved
    /// them. Not one of the profiler's categories: ours, so that the cache shows.
    AutocastCache,
}
// ANCHOR_END: category

impl Category {
    /// How many categories there are.
    pub const COUNT: usize = 8;

    pub const ALL: [Category; Category::COUNT] = [
        Category::Parameter,
        Category::Gradient,
        Category::OptimizerState,
        Category::Input,
        Category::Activation,
        Category::Temporary,
        Category::Other,
        Category::AutocastCache,
    ];

    /// PyTorch's memory profiler's name for the category.
    pub fn name(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::Gradient => "gradient",
            Category::OptimizerState => "optimizer_state",
            Category::Input => "input",
            Category::Activation => "activation",
            Category::Temporary => "temporary",
            Category::Other => "other",
            Category::AutocastCache => "autocast_cache",
        }
    }

    /// Position in [`Category::ALL`] (an index into per-category statistics).
    #[inline]
    pub fn index(self) -> usize {
        self as usize
    }

    /// The category of the thread's innermost scope, if any.
    #[inline]
    pub fn current() -> Option<Category> {
        CURRENT.with(|c| c.get())
    }

    /// Makes this the thread's category until the returned guard drops.
    pub fn scope(self) -> CategoryScope {
        CategoryScope {
            previous: CURRENT.with(|c| c.replace(Some(self))),
        }
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

thread_local! {
    static CURRENT: Cell<Option<Category>> = const { Cell::new(None) };
}

/// Restores the thread's previous category when dropped (scopes nest).
#[must_use = "the category applies only while the scope is alive"]
pub struct CategoryScope {
    previous: Option<Category>,
}

impl Drop for CategoryScope {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.previous));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_nest_and_restore() {
        assert_eq!(Category::current(), None);
        {
            let _p = Category::Parameter.scope();
            assert_eq!(Category::current(), Some(Category::Parameter));
            {
                let _s = Category::OptimizerState.scope();
                assert_eq!(Category::current(), Some(Category::OptimizerState));
            }
            assert_eq!(Category::current(), Some(Category::Parameter));
        }
        assert_eq!(Category::current(), None);
    }

    #[test]
    fn index_is_the_position_in_all() {
        for (i, c) in Category::ALL.iter().enumerate() {
            assert_eq!(c.index(), i);
        }
    }
}
