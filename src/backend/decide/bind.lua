-- The library functions the lean check calls on every decision, as locals of the
-- script: read through a global and a field at each call, each cost Redis 7.0 about
-- 200 instructions more (callgrind; a token bucket's check calls seven). A library of
-- Redis Functions may read no global while it loads, so bind_lean() sets them at a
-- call's start (the engine's entry, src/backend/decide/engine.rs), once per library
-- (once per call by EVALSHA, which runs the whole text at each call), and finds
-- native_numbers() there, which the lean writes then read as `numbers_native`.
local floor, ceil, max, min, format, to_number, type_of = nil, nil, nil, nil, nil, nil, nil
local function bind_lean()
  floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
  format, to_number, type_of = string.format, tonumber, type
  native_numbers()
end
