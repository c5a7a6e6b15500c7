from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FLOAT32: _ClassVar[DType]
    UINT8: _ClassVar[DType]
    UINT16: _ClassVar[DType]
    UINT32: _ClassVar[DType]
    UINT64: _ClassVar[DType]
    INT8: _ClassVar[DType]
    INT16: _ClassVar[DType]
    INT32: _ClassVar[DType]
    INT64: _ClassVar[DType]
    FLOAT16: _ClassVar[DType]
    FLOAT64: _ClassVar[DType]
    BOOL: _ClassVar[DType]

class AutoResetType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SAME_STEP: _ClassVar[AutoResetType]
    NEXT_STEP: _ClassVar[AutoResetType]
    DISABLED: _ClassVar[AutoResetType]

class CommunicatorStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GOOD: _ClassVar[CommunicatorStatus]
    ERROR: _ClassVar[CommunicatorStatus]
    CLOSED: _ClassVar[CommunicatorStatus]
FLOAT32: DType
UINT8: DType
UINT16: DType
UINT32: DType
UINT64: DType
INT8: DType
INT16: DType
INT32: DType
INT64: DType
FLOAT16: DType
FLOAT64: DType
BOOL: DType
SAME_STEP: AutoResetType
NEXT_STEP: AutoResetType
DISABLED: AutoResetType
GOOD: CommunicatorStatus
ERROR: CommunicatorStatus
CLOSED: CommunicatorStatus

class BoxSpaceDimension(_message.Message):
    __slots__ = ("low", "high")
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    low: float
    high: float
    def __init__(self, low: _Optional[float] = ..., high: _Optional[float] = ...) -> None: ...

class BoxSpace(_message.Message):
    __slots__ = ("dimensions", "shape_dimensions", "dtype")
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    SHAPE_DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    dimensions: _containers.RepeatedCompositeFieldContainer[BoxSpaceDimension]
    shape_dimensions: _containers.RepeatedScalarFieldContainer[int]
    dtype: DType
    def __init__(self, dimensions: _Optional[_Iterable[_Union[BoxSpaceDimension, _Mapping]]] = ..., shape_dimensions: _Optional[_Iterable[int]] = ..., dtype: _Optional[_Union[DType, str]] = ...) -> None: ...

class DiscreteSpace(_message.Message):
    __slots__ = ("high",)
    HIGH_FIELD_NUMBER: _ClassVar[int]
    high: int
    def __init__(self, high: _Optional[int] = ...) -> None: ...

class MultiDiscreteSpace(_message.Message):
    __slots__ = ("high",)
    HIGH_FIELD_NUMBER: _ClassVar[int]
    high: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, high: _Optional[_Iterable[int]] = ...) -> None: ...

class MultiBinarySpace(_message.Message):
    __slots__ = ("shape",)
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    shape: int
    def __init__(self, shape: _Optional[int] = ...) -> None: ...

class DictSpace(_message.Message):
    __slots__ = ("spaces",)
    class SpacesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Space
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Space, _Mapping]] = ...) -> None: ...
    SPACES_FIELD_NUMBER: _ClassVar[int]
    spaces: _containers.MessageMap[str, Space]
    def __init__(self, spaces: _Optional[_Mapping[str, Space]] = ...) -> None: ...

class Space(_message.Message):
    __slots__ = ("box_space", "discrete_space", "multi_discrete_space", "multi_binary_space", "dict_space")
    BOX_SPACE_FIELD_NUMBER: _ClassVar[int]
    DISCRETE_SPACE_FIELD_NUMBER: _ClassVar[int]
    MULTI_DISCRETE_SPACE_FIELD_NUMBER: _ClassVar[int]
    MULTI_BINARY_SPACE_FIELD_NUMBER: _ClassVar[int]
    DICT_SPACE_FIELD_NUMBER: _ClassVar[int]
    box_space: BoxSpace
    discrete_space: DiscreteSpace
    multi_discrete_space: MultiDiscreteSpace
    multi_binary_space: MultiBinarySpace
    dict_space: DictSpace
    def __init__(self, box_space: _Optional[_Union[BoxSpace, _Mapping]] = ..., discrete_space: _Optional[_Union[DiscreteSpace, _Mapping]] = ..., multi_discrete_space: _Optional[_Union[MultiDiscreteSpace, _Mapping]] = ..., multi_binary_space: _Optional[_Union[MultiBinarySpace, _Mapping]] = ..., dict_space: _Optional[_Union[DictSpace, _Mapping]] = ...) -> None: ...

class BoxPoint(_message.Message):
    __slots__ = ("values", "dtype", "shape")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[float]] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class DiscretePoint(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: int
    def __init__(self, value: _Optional[int] = ...) -> None: ...

class MultiDiscretePoint(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class MultiBinaryPoint(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, values: _Optional[_Iterable[bool]] = ...) -> None: ...

class DictPoint(_message.Message):
    __slots__ = ("values",)
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Point
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Point, _Mapping]] = ...) -> None: ...
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.MessageMap[str, Point]
    def __init__(self, values: _Optional[_Mapping[str, Point]] = ...) -> None: ...

class Point(_message.Message):
    __slots__ = ("box_point", "discrete_point", "multi_discrete_point", "multi_binary_point", "dict_point")
    BOX_POINT_FIELD_NUMBER: _ClassVar[int]
    DISCRETE_POINT_FIELD_NUMBER: _ClassVar[int]
    MULTI_DISCRETE_POINT_FIELD_NUMBER: _ClassVar[int]
    MULTI_BINARY_POINT_FIELD_NUMBER: _ClassVar[int]
    DICT_POINT_FIELD_NUMBER: _ClassVar[int]
    box_point: BoxPoint
    discrete_point: DiscretePoint
    multi_discrete_point: MultiDiscretePoint
    multi_binary_point: MultiBinaryPoint
    dict_point: DictPoint
    def __init__(self, box_point: _Optional[_Union[BoxPoint, _Mapping]] = ..., discrete_point: _Optional[_Union[DiscretePoint, _Mapping]] = ..., multi_discrete_point: _Optional[_Union[MultiDiscretePoint, _Mapping]] = ..., multi_binary_point: _Optional[_Union[MultiBinaryPoint, _Mapping]] = ..., dict_point: _Optional[_Union[DictPoint, _Mapping]] = ...) -> None: ...

class GymConnectorStartRequest(_message.Message):
    __slots__ = ("autoreset_type",)
    AUTORESET_TYPE_FIELD_NUMBER: _ClassVar[int]
    autoreset_type: AutoResetType
    def __init__(self, autoreset_type: _Optional[_Union[AutoResetType, str]] = ...) -> None: ...

class GymConnectorStartResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TrainingDefinitionRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AgentDefinition(_message.Message):
    __slots__ = ("obs_space", "action_space", "agent_type")
    OBS_SPACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_FIELD_NUMBER: _ClassVar[int]
    AGENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    obs_space: Space
    action_space: Space
    agent_type: str
    def __init__(self, obs_space: _Optional[_Union[Space, _Mapping]] = ..., action_space: _Optional[_Union[Space, _Mapping]] = ..., agent_type: _Optional[str] = ...) -> None: ...

class EnvironmentDefinition(_message.Message):
    __slots__ = ("agent_definitions",)
    class AgentDefinitionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AgentDefinition
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AgentDefinition, _Mapping]] = ...) -> None: ...
    AGENT_DEFINITIONS_FIELD_NUMBER: _ClassVar[int]
    agent_definitions: _containers.MessageMap[str, AgentDefinition]
    def __init__(self, agent_definitions: _Optional[_Mapping[str, AgentDefinition]] = ...) -> None: ...

class TrainingDefinition(_message.Message):
    __slots__ = ("environment_definitions",)
    ENVIRONMENT_DEFINITIONS_FIELD_NUMBER: _ClassVar[int]
    environment_definitions: _containers.RepeatedCompositeFieldContainer[EnvironmentDefinition]
    def __init__(self, environment_definitions: _Optional[_Iterable[_Union[EnvironmentDefinition, _Mapping]]] = ...) -> None: ...

class EnvironmentSettings(_message.Message):
    __slots__ = ("seed", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SEED_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    seed: int
    options: _containers.ScalarMap[str, str]
    def __init__(self, seed: _Optional[int] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Reset(_message.Message):
    __slots__ = ("environments",)
    class EnvironmentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: EnvironmentSettings
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[EnvironmentSettings, _Mapping]] = ...) -> None: ...
    ENVIRONMENTS_FIELD_NUMBER: _ClassVar[int]
    environments: _containers.MessageMap[int, EnvironmentSettings]
    def __init__(self, environments: _Optional[_Mapping[int, EnvironmentSettings]] = ...) -> None: ...

class EnvironmentStep(_message.Message):
    __slots__ = ("updates",)
    class UpdatesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Point
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Point, _Mapping]] = ...) -> None: ...
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    updates: _containers.MessageMap[str, Point]
    def __init__(self, updates: _Optional[_Mapping[str, Point]] = ...) -> None: ...

class Step(_message.Message):
    __slots__ = ("environments",)
    ENVIRONMENTS_FIELD_NUMBER: _ClassVar[int]
    environments: _containers.RepeatedCompositeFieldContainer[EnvironmentStep]
    def __init__(self, environments: _Optional[_Iterable[_Union[EnvironmentStep, _Mapping]]] = ...) -> None: ...

class StateUpdate(_message.Message):
    __slots__ = ("reset", "step", "status")
    RESET_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    reset: Reset
    step: Step
    status: CommunicatorStatus
    def __init__(self, reset: _Optional[_Union[Reset, _Mapping]] = ..., step: _Optional[_Union[Step, _Mapping]] = ..., status: _Optional[_Union[CommunicatorStatus, str]] = ...) -> None: ...

class AgentState(_message.Message):
    __slots__ = ("observations", "reward", "terminated", "truncated", "info")
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    observations: Point
    reward: float
    terminated: bool
    truncated: bool
    info: _containers.ScalarMap[str, str]
    def __init__(self, observations: _Optional[_Union[Point, _Mapping]] = ..., reward: _Optional[float] = ..., terminated: _Optional[bool] = ..., truncated: _Optional[bool] = ..., info: _Optional[_Mapping[str, str]] = ...) -> None: ...

class EnvironmentState(_message.Message):
    __slots__ = ("agent_states",)
    class AgentStatesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AgentState
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AgentState, _Mapping]] = ...) -> None: ...
    AGENT_STATES_FIELD_NUMBER: _ClassVar[int]
    agent_states: _containers.MessageMap[str, AgentState]
    def __init__(self, agent_states: _Optional[_Mapping[str, AgentState]] = ...) -> None: ...

class TrainingState(_message.Message):
    __slots__ = ("environment_states",)
    ENVIRONMENT_STATES_FIELD_NUMBER: _ClassVar[int]
    environment_states: _containers.RepeatedCompositeFieldContainer[EnvironmentState]
    def __init__(self, environment_states: _Optional[_Iterable[_Union[EnvironmentState, _Mapping]]] = ...) -> None: ...

class InitialAgentState(_message.Message):
    __slots__ = ("observations", "info")
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    observations: Point
    info: _containers.ScalarMap[str, str]
    def __init__(self, observations: _Optional[_Union[Point, _Mapping]] = ..., info: _Optional[_Mapping[str, str]] = ...) -> None: ...

class InitialEnvironmentState(_message.Message):
    __slots__ = ("agent_states",)
    class AgentStatesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: InitialAgentState
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[InitialAgentState, _Mapping]] = ...) -> None: ...
    AGENT_STATES_FIELD_NUMBER: _ClassVar[int]
    agent_states: _containers.MessageMap[str, InitialAgentState]
    def __init__(self, agent_states: _Optional[_Mapping[str, InitialAgentState]] = ...) -> None: ...

class InitialState(_message.Message):
    __slots__ = ("environment_states",)
    class EnvironmentStatesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: InitialEnvironmentState
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[InitialEnvironmentState, _Mapping]] = ...) -> None: ...
    ENVIRONMENT_STATES_FIELD_NUMBER: _ClassVar[int]
    environment_states: _containers.MessageMap[int, InitialEnvironmentState]
    def __init__(self, environment_states: _Optional[_Mapping[int, InitialEnvironmentState]] = ...) -> None: ...

class State(_message.Message):
    __slots__ = ("training_state", "initial_state")
    TRAINING_STATE_FIELD_NUMBER: _ClassVar[int]
    INITIAL_STATE_FIELD_NUMBER: _ClassVar[int]
    training_state: TrainingState
    initial_state: InitialState
    def __init__(self, training_state: _Optional[_Union[TrainingState, _Mapping]] = ..., initial_state: _Optional[_Union[InitialState, _Mapping]] = ...) -> None: ...
