-- ext: the extension's one-statement fenced UPDATE (one fence_next call).
\set id 1 + :client_id + :nclients * random(0, :rows / :nclients - 1)
\set n :n + 1
\set fence :base + :n
UPDATE ext_catalog SET visible_object = 'objects/' || :fence, fence_state = fence_next(fence_state, report_id, '0.' || :fence, 'strict', NULL, NULL) WHERE report_id = 'report/' || :id;
