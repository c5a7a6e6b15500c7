//! The step path of the Schola protocol between numpy columns and wire bytes.
//!
//! Python describes each agent once (`StepCodec(layout)`): its observation as a list of
//! leaves, each a key path into Dict points, a kind and a size, and its action kind.
//! `decode` turns a `State` reply into, per agent, the environments it appeared in and
//! its rewards, terminations, truncations, infos and observation leaves as flat arrays;
//! `encode` builds a `StateUpdate` step from per-agent action arrays. Errors name the
//! environment and agent, as the Python codec's do.

use std::collections::HashMap;

use numpy::{PyArray1, PyReadonlyArray1};
use prost::Message;
use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use crate::schola::{
    point, state, state_update, BoxPoint, DiscretePoint, EnvironmentStep, MultiBinaryPoint,
    MultiDiscretePoint, Point, State, StateUpdate, Step,
};

create_exception!(
    uerl_native,
    ActionTypeError,
    pyo3::exceptions::PyTypeError,
    "An action value the compiled encoder cannot read (the caller gathers it in Python)."
);

create_exception!(
    uerl_native,
    WireError,
    PyValueError,
    "Bytes that are not what the protocol says: the message names the environment and agent."
);

// Leaf kinds, as `training/protocol/step_layout.py` numbers them.
const BOX: u8 = 0;
const DISCRETE: u8 = 1;
const MULTI_DISCRETE: u8 = 2;
const MULTI_BINARY: u8 = 3;

fn kind_name(kind: u8) -> &'static str {
    match kind {
        BOX => "box_point",
        DISCRETE => "discrete_point",
        MULTI_DISCRETE => "multi_discrete_point",
        MULTI_BINARY => "multi_binary_point",
        _ => "dict_point",
    }
}

fn point_name(p: &Option<point::Point>) -> &'static str {
    match p {
        Some(point::Point::BoxPoint(_)) => "box_point",
        Some(point::Point::DiscretePoint(_)) => "discrete_point",
        Some(point::Point::MultiDiscretePoint(_)) => "multi_discrete_point",
        Some(point::Point::MultiBinaryPoint(_)) => "multi_binary_point",
        Some(point::Point::DictPoint(_)) => "dict_point",
        None => "nothing",
    }
}

#[derive(Clone)]
struct Leaf {
    path: Vec<String>,
    kind: u8,
    size: usize,
}

struct Action {
    kind: u8,
    size: usize,
    box_dtype: i32,
    box_shape: Vec<i32>,
}

impl Action {
    /// One environment's action as a point: `values` for a Box, `ints` for the rest.
    fn box_point(&self, values: Vec<f32>) -> Point {
        let b = BoxPoint { values, dtype: self.box_dtype, shape: self.box_shape.clone() };
        Point { point: Some(point::Point::BoxPoint(b)) }
    }

    fn int_point(&self, ints: &[i64]) -> Point {
        let p = match self.kind {
            DISCRETE => point::Point::DiscretePoint(DiscretePoint { value: ints[0] as i32 }),
            MULTI_DISCRETE => point::Point::MultiDiscretePoint(MultiDiscretePoint {
                values: ints.iter().map(|&x| x as i32).collect(),
            }),
            _ => point::Point::MultiBinaryPoint(MultiBinaryPoint {
                values: ints.iter().map(|&x| x != 0).collect(),
            }),
        };
        Point { point: Some(p) }
    }
}

pub(crate) struct AgentLayout {
    pub(crate) id: String,
    leaves: Vec<Leaf>,
    action: Option<Action>,
}

/// Values of one leaf for all rows of one agent, in the wire's own element types.
pub(crate) enum Column {
    F32(Vec<f32>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
}

pub(crate) struct AgentColumns {
    pub(crate) env: Vec<i32>,
    pub(crate) reward: Vec<f32>,
    pub(crate) terminated: Vec<bool>,
    pub(crate) truncated: Vec<bool>,
    pub(crate) infos: Vec<(usize, HashMap<String, String>)>,
    pub(crate) leaves: Vec<Column>,
}

fn path_text(path: &[String]) -> String {
    path.iter().map(|k| format!("['{k}']")).collect()
}

/// `msg` prefixed with where in a Dict point it happened (nothing at the top).
fn located(path: &[String], msg: String) -> String {
    if path.is_empty() {
        msg
    } else {
        format!("{}: {msg}", path_text(path))
    }
}

impl Leaf {
    /// Append this leaf's values from `p` (the agent's whole observation point).
    fn take(&self, p: &Point, out: &mut Column) -> Result<(), String> {
        let mut at = p;
        for (depth, key) in self.path.iter().enumerate() {
            match &at.point {
                Some(point::Point::DictPoint(d)) => match d.values.get(key) {
                    Some(sub) => at = sub,
                    None => return Err(located(&self.path[..depth], format!("missing key '{key}'"))),
                },
                other => {
                    let msg = format!("expected a dict_point, got {}", point_name(other));
                    return Err(located(&self.path[..depth], msg));
                }
            }
        }
        let wrong = |got: &Option<point::Point>| {
            let msg = format!("expected a {}, got {}", kind_name(self.kind), point_name(got));
            located(&self.path, msg)
        };
        let count = |n: usize| -> Result<(), String> {
            if n == self.size {
                Ok(())
            } else {
                Err(located(&self.path, format!("expected {} values, got {n}", self.size)))
            }
        };
        match (&at.point, out) {
            (Some(point::Point::BoxPoint(b)), Column::F32(v)) if self.kind == BOX => {
                count(b.values.len())?;
                v.extend_from_slice(&b.values);
            }
            (Some(point::Point::DiscretePoint(d)), Column::I64(v)) if self.kind == DISCRETE => {
                v.push(d.value as i64);
            }
            (Some(point::Point::MultiDiscretePoint(m)), Column::I64(v))
                if self.kind == MULTI_DISCRETE =>
            {
                count(m.values.len())?;
                v.extend(m.values.iter().map(|&x| x as i64));
            }
            (Some(point::Point::MultiBinaryPoint(m)), Column::Bool(v))
                if self.kind == MULTI_BINARY =>
            {
                count(m.values.len())?;
                v.extend_from_slice(&m.values);
            }
            (got, _) => return Err(wrong(got)),
        }
        Ok(())
    }

    fn column(&self, rows: usize) -> Column {
        match self.kind {
            BOX => Column::F32(Vec::with_capacity(rows * self.size)),
            MULTI_BINARY => Column::Bool(Vec::with_capacity(rows * self.size)),
            _ => Column::I64(Vec::with_capacity(rows * self.size)),
        }
    }
}

#[pyclass(module = "uerl_native", frozen)]
pub struct StepCodec {
    pub(crate) agents: Vec<AgentLayout>,
    index: HashMap<String, usize>,
    /// Per agent: the shape of its observation when it is one float32 Box (rows are then
    /// built here, as views of one array); None: the caller's Python assembles them.
    pub(crate) row_shapes: Vec<Option<Vec<usize>>>,
}

fn wire_err(msg: String) -> PyErr {
    WireError::new_err(msg)
}

impl StepCodec {
    /// A `StateUpdate` step straight from RLlib's per-environment `{agent: action}` dicts.
    /// Raises `TypeError` for an action value it cannot read (the caller then gathers in
    /// Python), `ValueError` naming the environment and agent for a wrong one.
    pub(crate) fn encode_dicts(&self, actions: &Bound<'_, PyList>, num_envs: usize) -> PyResult<Vec<u8>> {
        if actions.len() != num_envs {
            return Err(PyValueError::new_err(format!(
                "{} action dicts for {num_envs} environments",
                actions.len()
            )));
        }
        let mut envs: Vec<EnvironmentStep> = Vec::with_capacity(num_envs);
        for (i, item) in actions.iter().enumerate() {
            let dict = item.downcast::<PyDict>()?;
            let mut step = EnvironmentStep::default();
            for (key, value) in dict.iter() {
                let aid = key.downcast::<pyo3::types::PyString>()?.to_str()?;
                let Some(&k) = self.index.get(aid) else {
                    return Err(PyValueError::new_err(format!(
                        "environment {i}: action for unknown agent '{aid}'"
                    )));
                };
                let agent = &self.agents[k];
                let action = agent.action.as_ref().ok_or_else(|| {
                    pyo3::exceptions::PyTypeError::new_err("no flat action space")
                })?;
                let wrong = |n: usize| {
                    PyValueError::new_err(format!(
                        "action of '{aid}': expected {} values per environment, got {n}",
                        action.size
                    ))
                };
                let point = match action.kind {
                    DISCRETE => action.int_point(&[value.extract::<i64>()?]),
                    BOX => {
                        let values: Vec<f32> = match value.extract::<numpy::PyReadonlyArrayDyn<'_, f32>>() {
                            Ok(a) => a.as_array().iter().copied().collect(),
                            Err(_) => value
                                .extract::<numpy::PyReadonlyArrayDyn<'_, f64>>()?
                                .as_array()
                                .iter()
                                .map(|&x| x as f32)
                                .collect(),
                        };
                        if values.len() != action.size {
                            return Err(wrong(values.len()));
                        }
                        action.box_point(values)
                    }
                    _ => {
                        let values = value.extract::<numpy::PyReadonlyArrayDyn<'_, i64>>()?;
                        let ints: Vec<i64> = values.as_array().iter().copied().collect();
                        if ints.len() != action.size {
                            return Err(wrong(ints.len()));
                        }
                        action.int_point(&ints)
                    }
                };
                step.updates.insert(agent.id.clone(), point);
            }
            envs.push(step);
        }
        let update = StateUpdate {
            update: Some(state_update::Update::Step(Step { environments: envs })),
            status: 0,
        };
        Ok(update.encode_to_vec())
    }

    pub(crate) fn decode_columns(&self, data: &[u8]) -> Result<(usize, Vec<AgentColumns>), String> {
        let state = State::decode(data).map_err(|e| {
            format!("reply of {} bytes is not a State message ({e})", data.len())
        })?;
        let training = match state.optional_training_state {
            Some(state::OptionalTrainingState::TrainingState(t)) => t,
            None => return Err("reply has no training_state".into()),
        };
        let n = training.environment_states.len();
        let mut cols: Vec<AgentColumns> = self
            .agents
            .iter()
            .map(|a| AgentColumns {
                env: Vec::with_capacity(n),
                reward: Vec::with_capacity(n),
                terminated: Vec::with_capacity(n),
                truncated: Vec::with_capacity(n),
                infos: Vec::new(),
                leaves: a.leaves.iter().map(|l| l.column(n)).collect(),
            })
            .collect();
        for (i, env) in training.environment_states.iter().enumerate() {
            for (aid, st) in &env.agent_states {
                let Some(&k) = self.index.get(aid) else {
                    return Err(format!("environment {i}: unknown agent '{aid}'"));
                };
                let layout = &self.agents[k];
                let col = &mut cols[k];
                if st.reward.is_nan() {
                    return Err(format!("environment {i} agent '{aid}' reward is NaN"));
                }
                let empty = Point::default();
                let obs = st.observations.as_ref().unwrap_or(&empty);
                for (leaf, out) in layout.leaves.iter().zip(col.leaves.iter_mut()) {
                    leaf.take(obs, out).map_err(|e| {
                        format!("environment {i} agent '{aid}' observations: {e}")
                    })?;
                }
                col.env.push(i as i32);
                col.reward.push(st.reward);
                col.terminated.push(st.terminated);
                col.truncated.push(st.truncated);
                if !st.info.is_empty() {
                    col.infos.push((col.env.len() - 1, st.info.clone()));
                }
            }
        }
        Ok((n, cols))
    }
}

#[pymethods]
impl StepCodec {
    /// `layout`: one `(agent_id, leaves, action)` per agent, where `leaves` is a list of
    /// `(key_path, kind, size)` and `action` is `(kind, size, box_dtype, box_shape)` or
    /// None (an action space this codec does not encode, e.g. Dict).
    #[new]
    #[pyo3(signature = (layout, row_shapes=None))]
    fn new(
        layout: Vec<(String, Vec<(Vec<String>, u8, usize)>, Option<(u8, usize, i32, Vec<i32>)>)>,
        row_shapes: Option<Vec<Option<Vec<usize>>>>,
    ) -> PyResult<Self> {
        let mut agents = Vec::new();
        let mut index = HashMap::new();
        for (k, (id, leaves, action)) in layout.into_iter().enumerate() {
            for (_, kind, _) in &leaves {
                if *kind > MULTI_BINARY {
                    return Err(PyValueError::new_err(format!("agent {id:?}: leaf kind {kind}")));
                }
            }
            index.insert(id.clone(), k);
            agents.push(AgentLayout {
                id,
                leaves: leaves
                    .into_iter()
                    .map(|(path, kind, size)| Leaf { path, kind, size })
                    .collect(),
                action: action.map(|(kind, size, box_dtype, box_shape)| Action {
                    kind,
                    size,
                    box_dtype,
                    box_shape,
                }),
            });
        }
        let row_shapes = row_shapes.unwrap_or_else(|| vec![None; agents.len()]);
        if row_shapes.len() != agents.len() {
            return Err(PyValueError::new_err("one row shape (or None) per agent"));
        }
        Ok(Self { agents, index, row_shapes })
    }

    /// A `State` reply as `(num_envs, agents)`: per agent of the layout, in its order,
    /// `(env, reward, terminated, truncated, leaves, infos)`; `env` holds the environment
    /// index of each row, `leaves` one flat array per leaf (float32 box, int64 discrete
    /// and multi-discrete, bool multi-binary), `infos` `(row, dict)` for non-empty infos.
    fn decode<'py>(&self, py: Python<'py>, data: &[u8]) -> PyResult<(usize, Bound<'py, PyList>)> {
        let (n, cols) = self.decode_columns(data).map_err(wire_err)?;
        let agents = PyList::empty(py);
        for col in cols {
            let leaves = PyList::empty(py);
            for leaf in col.leaves {
                match leaf {
                    Column::F32(v) => leaves.append(PyArray1::from_vec(py, v))?,
                    Column::I64(v) => leaves.append(PyArray1::from_vec(py, v))?,
                    Column::Bool(v) => leaves.append(PyArray1::from_vec(py, v))?,
                }
            }
            let infos = PyList::empty(py);
            for (row, info) in col.infos {
                let d = PyDict::new(py);
                for (key, value) in info {
                    d.set_item(key, value)?;
                }
                infos.append((row, d))?;
            }
            let entry = PyTuple::new(
                py,
                [
                    PyArray1::from_vec(py, col.env).into_any(),
                    PyArray1::from_vec(py, col.reward).into_any(),
                    PyArray1::from_vec(py, col.terminated).into_any(),
                    PyArray1::from_vec(py, col.truncated).into_any(),
                    leaves.into_any(),
                    infos.into_any(),
                ],
            )?;
            agents.append(entry)?;
        }
        Ok((n, agents))
    }

    /// A `StateUpdate` step for `num_envs` environments from `actions`: per agent, a tuple
    /// `(agent_index, env, values)` where `env` (int32) lists the environments that act
    /// and `values` holds their actions flat: float32 for Box, int64 otherwise
    /// (MultiBinary as 0/1).
    fn encode<'py>(
        &self,
        py: Python<'py>,
        num_envs: usize,
        actions: Vec<(usize, PyReadonlyArray1<'py, i32>, Bound<'py, PyAny>)>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut envs: Vec<EnvironmentStep> = (0..num_envs).map(|_| EnvironmentStep::default()).collect();
        for (k, env, values) in actions {
            let agent = self
                .agents
                .get(k)
                .ok_or_else(|| PyValueError::new_err(format!("agent index {k}")))?;
            let action = agent.action.as_ref().ok_or_else(|| {
                PyValueError::new_err(format!("agent {:?}: no encodable action space", agent.id))
            })?;
            let env = env.as_slice()?;
            let size = action.size;
            // Box actions arrive as float32, the other kinds as int64 (layout.py's `gather`).
            let (floats, ints) = if action.kind == BOX {
                (values.extract::<PyReadonlyArray1<'py, f32>>()?.as_slice()?.to_vec(), vec![])
            } else {
                (vec![], values.extract::<PyReadonlyArray1<'py, i64>>()?.as_slice()?.to_vec())
            };
            let count = floats.len().max(ints.len());
            if count != env.len() * size {
                return Err(PyValueError::new_err(format!(
                    "action of '{}': {count} values for {} environments of {size}",
                    agent.id,
                    env.len()
                )));
            }
            for (r, &i) in env.iter().enumerate() {
                let step = envs
                    .get_mut(i as usize)
                    .ok_or_else(|| PyValueError::new_err(format!("environment {i} out of range")))?;
                let rows = r * size..(r + 1) * size;
                let point = if action.kind == BOX {
                    action.box_point(floats[rows].to_vec())
                } else {
                    action.int_point(&ints[rows])
                };
                step.updates.insert(agent.id.clone(), point);
            }
        }
        let update = StateUpdate {
            update: Some(state_update::Update::Step(Step { environments: envs })),
            status: 0,
        };
        Ok(PyBytes::new(py, &update.encode_to_vec()))
    }
}
