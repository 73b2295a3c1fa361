//! [`Embedding`]: a lookup table of vectors indexed by integer ids.

use super::init::Init;
use super::{Module, build_in, make_parameter};
use crate::error::{Result, twins, unwrap};
use crate::{DType, NDArray, NDManager};

/// A table of `num_embeddings` vectors of size `embedding_dim` looked up by integer
/// ids (PyTorch's `nn.Embedding`): an input of ids (I32/I64, any shape) gives
/// `ids.shape + [embedding_dim]`. The weight `[num_embeddings, embedding_dim]` is
/// N(0, 1), f32, by default ([`Embedding::builder`] for the dtype or another
/// initialisation). Forward is the [`NDArray::embedding`](crate::NDArray::embedding)
/// op: differentiable in the weight (repeated ids accumulate their gradients). No
/// `padding_idx`, `max_norm` or sparse gradients. The output belongs to the ids'
/// manager (as every layer's output belongs to its input's manager).
///
/// ```
/// use ndscope::nn::{Embedding, Module};
/// use ndscope::NDManager;
/// let m = NDManager::new();
/// let emb = Embedding::new(&m, 10, 4);
/// let ids = m.create(&[1i64, 7, 7, 0, 3, 9], [2, 3]);
/// let y = emb.forward(ids);
/// assert_eq!(y.shape().dims(), &[2, 3, 4]);
/// assert_eq!(y.get("0, 1").to_vec::<f32>()?, emb.weight().get("7").to_vec::<f32>()?);
/// # Ok::<(), ndscope::NdError>(())
/// ```
#[derive(Debug)]
pub struct Embedding {
    weight: NDArray,
    manager: NDManager,
    num_embeddings: usize,
    embedding_dim: usize,
    training: bool,
}

/// Options of an [`Embedding`] layer ([`Embedding::builder`]).
#[derive(Clone, Debug)]
pub struct EmbeddingBuilder {
    num_embeddings: usize,
    embedding_dim: usize,
    dtype: DType,
    init: Init,
}

impl EmbeddingBuilder {
    /// The weight's dtype, F32 (default) or F64.
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    /// The weight's initialisation (default N(0, 1), as PyTorch).
    pub fn weight_init(mut self, init: Init) -> Self {
        self.init = init;
        self
    }

    twins! {
        /// Build the layer in a new sub-manager of `m`. Panics on failure.
        pub fn build,
        /// [`EmbeddingBuilder::build`]. Errors: `InvalidArgument` (a non-float dtype, an
        /// initialisation that is invalid), `ManagerClosed`/`ManagerCapped`. Nothing is
        /// left in `m` on an error.
        pub fn try_build(&self, m: &NDManager) -> Embedding {
            super::check_param_dtype("embedding", self.dtype)?;
            let shape = [self.num_embeddings, self.embedding_dim];
            let (manager, weight) = build_in(m, "Embedding", |sub| {
                make_parameter(self.init.try_create(sub, shape, self.dtype)?)
            })?;
            Ok(Embedding {
                weight,
                manager,
                num_embeddings: self.num_embeddings,
                embedding_dim: self.embedding_dim,
                training: true,
            })
        }
    }
}

impl Embedding {
    /// A table of `num_embeddings` vectors of size `embedding_dim`, N(0, 1), f32, in a
    /// new sub-manager of `m`. Panics on failure.
    #[track_caller]
    pub fn new(m: &NDManager, num_embeddings: usize, embedding_dim: usize) -> Embedding {
        unwrap(Embedding::builder(num_embeddings, embedding_dim).try_build(m))
    }

    /// [`Embedding::new`]; errors as [`EmbeddingBuilder::try_build`].
    pub fn try_new(
        m: &NDManager,
        num_embeddings: usize,
        embedding_dim: usize,
    ) -> Result<Embedding> {
        Embedding::builder(num_embeddings, embedding_dim).try_build(m)
    }

    /// Options for a table of `num_embeddings` vectors of size `embedding_dim`.
    ///
    /// ```
    /// use ndscope::nn::{Embedding, init::Init};
    /// use ndscope::{DType, NDManager};
    /// let m = NDManager::new();
    /// let emb = Embedding::builder(3, 2).dtype(DType::F64).weight_init(Init::Zeros).build(&m);
    /// assert_eq!(emb.weight().to_vec::<f64>()?, vec![0.0; 6]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    pub fn builder(num_embeddings: usize, embedding_dim: usize) -> EmbeddingBuilder {
        EmbeddingBuilder {
            num_embeddings,
            embedding_dim,
            dtype: DType::F32,
            init: Init::Normal {
                mean: 0.0,
                std: 1.0,
            },
        }
    }

    /// The table, `[num_embeddings, embedding_dim]`.
    pub fn weight(&self) -> NDArray {
        self.weight
    }

    /// The number of vectors (ids run from 0 to `num_embeddings - 1`).
    pub fn num_embeddings(&self) -> usize {
        self.num_embeddings
    }

    /// The size of each vector.
    pub fn embedding_dim(&self) -> usize {
        self.embedding_dim
    }

    /// The sub-manager holding the weight and its gradient.
    pub fn manager(&self) -> NDManager {
        self.manager.clone()
    }
}

impl Module for Embedding {
    /// Errors: those of [`NDArray::try_embedding`](crate::NDArray::try_embedding)
    /// (`UnsupportedDType` for float or Bool ids, `Index` for an id out of range),
    /// `Closed`, and those of moving the result to the ids' manager.
    fn try_forward(&self, ids: NDArray) -> Result<NDArray> {
        let home = ids.try_manager()?;
        let y = self.weight.try_embedding(ids)?;
        // The op's result belongs to its first input's manager, the table's: move it
        // to the ids' manager, as for every other layer's output (the model's manager
        // holds only the model).
        match y.try_attach(&home) {
            Ok(y) => Ok(y),
            Err(e) => {
                y.close();
                Err(e)
            }
        }
    }

    fn named_parameters(&self) -> Vec<(String, NDArray)> {
        vec![("weight".to_string(), self.weight)]
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }

    fn manager(&self) -> Option<NDManager> {
        Some(self.manager.clone())
    }
}
