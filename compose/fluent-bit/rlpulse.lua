-- NOT RUN HERE (see fluent-bit.conf). A log record line of a rank file as `rlpulse index`
-- indexes it: document id <producer_id>:<seq>, @timestamp in milliseconds, and the record's
-- own time as its event time (so it lands in the daily index of the day it happened).
function rlpulse_document(tag, timestamp, record)
    local ns = record["timestamp_ns"]
    if record["producer_id"] == nil or record["seq"] == nil or ns == nil then
        return 0, timestamp, record
    end
    record["doc_id"] = record["producer_id"] .. ":" .. string.format("%d", record["seq"])
    record["@timestamp"] = math.floor(ns / 1000000)
    record["kind"] = nil
    return 1, ns / 1e9, record
end
