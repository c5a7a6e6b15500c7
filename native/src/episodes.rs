//! Episode bookkeeping of a vector of environments under NEXT_STEP autoreset, and the
//! step reply in RLlib's shape: five lists (one dict per environment) of observations,
//! rewards, terminateds, truncateds (each with "__all__") and infos.
//!
//! The reference is `training/rllib/episodes.py` (`PythonEpisodes`); the tests run
//! both on the same replies. Per environment and agent this episode: seen, and seen
//! end; an environment is over when every agent it has seen has ended, by termination
//! unless one of them was truncated on the last step. The step after that is its
//! restart: reset observations, reward 0, nothing done.

use numpy::PyReadonlyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

type Column<'py> = (
    PyReadonlyArray1<'py, i32>,
    PyReadonlyArray1<'py, f32>,
    PyReadonlyArray1<'py, bool>,
    PyReadonlyArray1<'py, bool>,
    Bound<'py, PyAny>,
    Bound<'py, PyList>,
);

#[pyclass(module = "uerl_native")]
pub struct Episodes {
    agents: Vec<Py<PyString>>,
    all: Py<PyString>,
    num_envs: usize,
    seen: Vec<bool>,
    done: Vec<bool>,
    restarting: Vec<bool>,
}

#[pymethods]
impl Episodes {
    #[new]
    fn new(py: Python<'_>, agents: Vec<String>, num_envs: usize) -> Self {
        let count = agents.len();
        Self {
            agents: agents.iter().map(|a| PyString::intern(py, a).unbind()).collect(),
            all: PyString::intern(py, "__all__").unbind(),
            num_envs,
            seen: vec![false; num_envs * count],
            done: vec![false; num_envs * count],
            restarting: vec![false; num_envs],
        }
    }

    /// After a reset: `present[i]` lists the agent indices environment i observed.
    fn reset(&mut self, present: Vec<Vec<usize>>) {
        let count = self.agents.len();
        self.seen.fill(false);
        self.done.fill(false);
        self.restarting.fill(false);
        for (i, agents) in present.iter().enumerate().take(self.num_envs) {
            for &k in agents {
                if k < count {
                    self.seen[i * count + k] = true;
                }
            }
        }
    }

    /// One step reply: per agent its decoded columns `(env, reward, terminated,
    /// truncated, leaves, infos)` (`infos` as `(row, dict)`), and its observation rows.
    fn step<'py>(
        &mut self,
        py: Python<'py>,
        columns: Vec<Column<'py>>,
        rows: Vec<Bound<'py, PyList>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let mut views = Vec::with_capacity(columns.len());
        for (env, reward, term, trunc, _leaves, infos) in &columns {
            let infos = infos
                .iter()
                .map(|item| item.extract::<(usize, Bound<'py, PyDict>)>())
                .collect::<PyResult<Vec<_>>>()?;
            views.push(View {
                env: env.as_slice()?,
                reward: reward.as_slice()?,
                terminated: term.as_slice()?,
                truncated: trunc.as_slice()?,
                infos,
            });
        }
        self.advance(py, &views, &rows)
    }
}

/// One agent's columns, borrowed: from numpy arrays (`step`) or from the codec directly.
pub struct View<'a, 'py> {
    pub env: &'a [i32],
    pub reward: &'a [f32],
    pub terminated: &'a [bool],
    pub truncated: &'a [bool],
    pub infos: Vec<(usize, Bound<'py, PyDict>)>,
}

impl Episodes {
    pub fn advance<'py>(
        &mut self,
        py: Python<'py>,
        columns: &[View<'_, 'py>],
        rows: &[Bound<'py, PyList>],
    ) -> PyResult<Bound<'py, PyList>> {
        let (n, count) = (self.num_envs, self.agents.len());
        let mut present = vec![false; n * count];
        let mut ended = vec![false; n * count];
        let mut cut = vec![false; n];
        for (k, col) in columns.iter().enumerate() {
            let (env, term, trunc) = (col.env, col.terminated, col.truncated);
            for (r, &i) in env.iter().enumerate() {
                let i = i as usize;
                if i >= n || k >= count {
                    return Err(pyo3::exceptions::PyValueError::new_err(format!("row {r}: environment {i}")));
                }
                present[i * count + k] = true;
                ended[i * count + k] = term[r] || trunc[r];
                cut[i] |= trunc[r];
            }
        }
        let was_restarting = self.restarting.clone();
        let mut term_all = vec![false; n];
        let mut trunc_all = vec![false; n];
        for i in 0..n {
            let row = i * count..(i + 1) * count;
            let fresh = was_restarting[i];
            let (mut any_seen, mut open) = (false, false);
            for j in row {
                self.seen[j] = if fresh { present[j] } else { self.seen[j] || present[j] };
                self.done[j] = !fresh && (self.done[j] || ended[j]);
                any_seen |= self.seen[j];
                open |= self.seen[j] && !self.done[j];
            }
            let finished = !fresh && any_seen && !open;
            term_all[i] = finished && !cut[i];
            trunc_all[i] = finished && cut[i];
            self.restarting[i] = finished;
        }
        let new = |_: usize| PyDict::new(py);
        let observations: Vec<_> = (0..n).map(new).collect();
        let rewards: Vec<_> = (0..n).map(new).collect();
        let terminateds: Vec<_> = (0..n).map(new).collect();
        let truncateds: Vec<_> = (0..n).map(new).collect();
        let infos: Vec<_> = (0..n).map(new).collect();
        for (k, col) in columns.iter().enumerate() {
            let (env, reward, term, trunc) = (col.env, col.reward, col.terminated, col.truncated);
            let aid = self.agents[k].bind(py);
            let obs = &rows[k];
            let mut given = col.infos.iter().peekable();
            for (r, &i) in env.iter().enumerate() {
                let i = i as usize;
                let again = was_restarting[i];
                observations[i].set_item(aid, obs.get_item(r)?)?;
                rewards[i].set_item(aid, if again { 0.0 } else { reward[r] as f64 })?;
                terminateds[i].set_item(aid, !again && term[r])?;
                truncateds[i].set_item(aid, !again && trunc[r])?;
                let info = match given.peek() {
                    Some((row, _)) if *row == r => given.next().unwrap().1.clone(),
                    _ => PyDict::new(py),
                };
                infos[i].set_item(aid, info)?;
            }
        }
        let all = self.all.bind(py);
        for i in 0..n {
            terminateds[i].set_item(all, term_all[i])?;
            truncateds[i].set_item(all, trunc_all[i])?;
        }
        PyList::new(
            py,
            [
                PyList::new(py, observations)?,
                PyList::new(py, rewards)?,
                PyList::new(py, terminateds)?,
                PyList::new(py, truncateds)?,
                PyList::new(py, infos)?,
            ],
        )
    }
}
