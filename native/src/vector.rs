//! One vector step in one call from Python: RLlib's action dicts in, RLlib's five
//! per-environment lists out; encode, call, decode and bookkeeping all on this side.
//! (Each is also exposed alone, and tested against its Python reference.)

use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::codec::{ActionTypeError, Column, StepCodec, WireError};
use crate::episodes::{Episodes, View};
use crate::transport::Channel;

fn leaf_array<'py>(py: Python<'py>, leaf: &Column) -> Bound<'py, PyAny> {
    match leaf {
        Column::F32(v) => PyArray1::from_slice(py, v).into_any(),
        Column::I64(v) => PyArray1::from_slice(py, v).into_any(),
        Column::Bool(v) => PyArray1::from_slice(py, v).into_any(),
    }
}

/// `rows(k, leaves, m)` builds agent k's observation rows where the codec has no row
/// shape for it (Dict spaces, dtype casts): the space's meaning stays in Python.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn vector_step<'py>(
    py: Python<'py>,
    codec: PyRef<'py, StepCodec>,
    channel: PyRef<'py, Channel>,
    mut episodes: PyRefMut<'py, Episodes>,
    actions: &Bound<'py, PyList>,
    num_envs: usize,
    method: &str,
    timeout_s: f64,
    rows: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    let request = codec.encode_dicts(actions, num_envs).map_err(|e| {
        if e.is_instance_of::<pyo3::exceptions::PyTypeError>(py) {
            ActionTypeError::new_err(e.to_string())
        } else {
            e
        }
    })?;
    let reply = channel.call_bytes(py, method, &request, timeout_s)?;
    let (n, columns) = codec.decode_columns(&reply).map_err(WireError::new_err)?;
    if n != num_envs {
        return Err(WireError::new_err(format!("reply has {n} environments, expected {num_envs}")));
    }
    let mut row_lists = Vec::with_capacity(columns.len());
    let mut views = Vec::with_capacity(columns.len());
    for (k, col) in columns.iter().enumerate() {
        let m = col.env.len();
        let list = match (&codec.row_shapes[k], col.leaves.as_slice()) {
            (Some(shape), [Column::F32(values)]) => {
                let mut full = Vec::with_capacity(1 + shape.len());
                full.push(m);
                full.extend_from_slice(shape);
                let batch = PyArray1::from_slice(py, values).reshape(full)?;
                PyList::new(py, batch.try_iter()?.collect::<PyResult<Vec<_>>>()?)?
            }
            _ => {
                let leaves = PyList::new(py, col.leaves.iter().map(|leaf| leaf_array(py, leaf)))?;
                rows.call1((k, leaves, m))?.downcast_into::<PyList>()?
            }
        };
        row_lists.push(list);
        let infos = col
            .infos
            .iter()
            .map(|(row, info)| {
                let dict = PyDict::new(py);
                for (key, value) in info {
                    dict.set_item(key, value)?;
                }
                Ok((*row, dict))
            })
            .collect::<PyResult<Vec<_>>>()?;
        views.push(View {
            env: &col.env,
            reward: &col.reward,
            terminated: &col.terminated,
            truncated: &col.truncated,
            infos,
        });
    }
    episodes.advance(py, &views, &row_lists)
}
