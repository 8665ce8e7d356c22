-- prot: a table under fence_protect; the row trigger checks the token.
\set id 1 + :client_id + :nclients * random(0, :rows / :nclients - 1)
\set n :n + 1
\set fence :base + :n
UPDATE prot_catalog SET visible_object = 'objects/' || :fence, fence_token = '0.' || :fence WHERE report_id = 'report/' || :id;
